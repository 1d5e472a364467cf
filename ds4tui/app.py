"""The ds4tui chat app: layout, key bindings and the wiring between the engine thread and the panes.

Data flow (ARCHITECTURE.md "data flow of one chat turn"): a thread worker opens the model
(``LoadProgress`` events), then each prompt runs ``ChatEngine.run_turn`` in a thread worker; the
engine thread only appends small event dataclasses to an ``EventQueue``.  One UI timer drains the
queue ~5.3 times a second (a late tick is not dropped): token text goes to the current turn in one
write per tick (a light widget for the text still growing, Markdown once it is finished,
widgets/chat.py), the newest
``StatsSnapshot`` goes to the panes (every PANES_S, 2 s, while an answer streams), and prefill progress,
finished turns and errors are handled in order; memory is sampled from the same timer once a
second (while an answer streams, with the panes' redraw).  Knobs call the engine's thread-safe setters, which never wait for a running cycle; the
engine applies them at the next cycle and logs them, and the panes mark that point on their
series.

The app must not slow down what it measures (ux.md §0 item 5).  While a turn runs the engine
thread and the interface share the interpreter and the cores: each C step of the engine ends by
taking the interpreter back, and waits while the interface holds it, and on a CPU engine every
millisecond the interface computes is taken from the engine's cores.  So the interface's work
while an answer streams is bounded by the timer, not by the token rate (ux.md §2.4): no layout of
the screen in the steady state (the engine prefills at once but decodes only once the question and
the rows its answer streams into are laid out, a few frames; a prefill that is already over is not
drawn); the interpreter's switch interval is lowered to SWITCH_S while a turn runs (the engine
waits at most that long); the objects that exist once the model is loaded
are moved out of the garbage collector's sight (``gc.freeze``: a full collection of the
tokenizer's and Textual's objects would hold the interpreter for ~0.1 s), and so are, at the start
of each turn, those of the turns before (a new chat collects them).  The interface measures its own
cost — the UI thread's CPU time per second of streaming — and shows it in the throughput pane and
in the stats export (:class:`InterfaceCost`).
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import errno
import gc
import json
import os
import shlex
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace as _replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.widgets import Footer, Header, Input, ProgressBar, Select, Static, Switch
from textual.worker import WorkerCancelled, WorkerFailed

from ds4tui.engine import prices
from ds4tui.engine import worker as W
from ds4tui.engine.backend import DEFAULT_SCHEDULER_POLICY, SCHEDULER_POLICIES, DSparkKnobs, knob_fields
from ds4tui.engine.stats import format_line
from ds4tui.engine.telemetry import MemoryHistory, format_bytes, plural, select_backend
from ds4tui.engine.timeline import SpecTimeline
from ds4tui.widgets.chat import AssistantMessage, ChatView, PromptInput, UserMessage
from ds4tui.widgets.dialogs import (AskPath, Confirm, ConfirmContext, ConfirmNewChat, ConfirmQuit, ErrorDialog,
                                    InfoDialog)
from ds4tui.widgets.histogram import Histogram
from ds4tui.widgets.memory import MemoryPane
from ds4tui.widgets.pane import Pane, PaneColumn, PaneRow, set_line
from ds4tui.widgets.screen import ChatScreen
from ds4tui.widgets.speculation import (AcceptPane, KnobsPane, NoDraftPane, PolicySelect, StagesPane, SupportPane,
                                        ThroughputPane, explain_reasons, knob_words, knobs_state,
                                        threshold_text)

#: Period of the one UI timer (seconds): engine events are handled, and the text of a streaming
#: answer written, ~5.3 times a second (ux.md §0 item 2).  A tick that comes late is not
#: dropped (the next ones keep their times: at most one write more right after it), so the text
#: reaches the screen at least 5 times a second with a margin for the first and last ticks' delays.
FLUSH_S = 0.19
#: Period of the speculation panes (and the memory pane) while a turn runs (seconds; when it ends
#: they are drawn at once).  Their frame is the costliest the interface draws while an answer
#: streams (it spans the screen: ~9-11 ms on a 2-core machine, against 2-4 ms for the text's), so
#: every 2 s rather than every second (ux.md §2.4).
PANES_S = 2.0
#: Memory sampling period (seconds).
MEMORY_S = 1.0
#: The interpreter's switch interval while a turn runs (seconds; Python's default is 5 ms, longer
#: than one decode step of a small model on a GPU): how long the engine thread, back from a C step,
#: may wait for the interface to hand the interpreter over.
SWITCH_S = 0.0001
#: The garbage collector's thresholds while a turn runs (Python's are 700, 10, 10): a young pass
#: every 10 000 allocations, not 700 (drawing a frame allocates thousands of short-lived objects: at
#: 700 the young passes took ~40 passes and 12-22 ms of the UI thread in a 2.5-s answer of the demo
#: pair on a 2-core machine, at 10 000 one pass of 3-5 ms), and the full pass (tens of
#: milliseconds, holding the interpreter the engine thread needs after each step) waits for the
#: end of the turn.
GC_THRESHOLDS = (10_000, 10, 1000)
#: Longest wait between the prefill's end and the first decode cycle (seconds): the question and
#: the rows its answer will stream into are laid out first (a few frames, a few tens of
#: milliseconds, most of them during the prefill), so that those layouts of the screen do not run
#: on the cores while the engine decodes.
SETTLE_MAX_S = 2.0
#: Frames the screen gets before the engine decodes (a layout can ask for another: a scroll bar shown).
SETTLE_FRAMES = 4
#: The interface's CPU share is reported once answers have streamed this long (seconds).
MIN_COST_S = 1.0
#: Confidence threshold step of F7/F8 and -/+.
THRESHOLD_STEP = 0.05


class PrefillBar(ProgressBar):
    """The load's and the prefill's progress bar (no ETA).  ``show(on)``: shown or hidden (CSS
    class ``active``).  Textual's timers of the bar (the percentage and ETA redrawn every second,
    and the bar's animation 15 times a second while it has no total) run only while it is shown:
    hidden, each of their ticks would still wake the UI thread, which on a CPU engine takes a
    core from the engine for a moment (ux.md §2.4).  Its total is 1 until the first progress, so
    it never runs the animation."""

    def __init__(self, **kw):
        self._own_timers: list = []
        super().__init__(total=1, show_eta=False, **kw)

    def set_interval(self, *args, **kw):
        """(Textual's ``ProgressBar`` starts its timer here: it is paused while the bar is hidden.)"""
        timer = super().set_interval(*args, **kw)
        self._own_timers.append(timer)
        if not self.has_class("active"):
            timer.pause()
        return timer

    def show(self, on: bool) -> None:
        self.add_class("active") if on else self.remove_class("active")
        for timer in self._own_timers:
            timer.resume() if on else timer.pause()


def _knobs_dict(knobs) -> dict | None:
    return knobs.to_dict() if knobs is not None else None


#: The ids of the knobs pane's controls.
KNOB_CONTROLS = ("dspark", "scheduler", "threshold", "max-draft", "policy")


@dataclass
class ChatOptions:
    """What ``ds4tui chat`` was started with (sampling defaults: greedy)."""

    model: str | None
    support: str | None = None
    dspark: bool = True
    ctx: int | None = None
    backend: str = "auto"
    threads: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    top_k: int = 0
    min_p: float = 0.0
    numerics: str = "ds4"
    think: bool = True
    system: str | None = None
    max_tokens: int | None = None
    save_dir: Path = field(default_factory=Path.cwd)
    telemetry: str | None = None
    # what the environment variables set (ds4tui.commands.environment.Settings): the engine's GPU
    # weight layout and library, the DSpark knobs the session starts with, ds4's stats line at exit
    gpu_layout: str = "planar"
    gpu_library: str | None = None
    prefill_gemm: str = "auto"
    #: the matmul activations numerics option (spec ds4.md §2.9.5): "auto" (q8 on the cpu backend, f32 on
    #: hip), "f32" or "q8"
    activations: str = "auto"
    #: the gpu_graphs option (spec platform.md §8): "off" or "on" (hip backend)
    gpu_graphs: str = "off"
    #: --draft-vocab: the tokens DSpark's drafter proposes from ("auto", "full" or a count; spec dspark.md §2.6)
    draft_vocab: str = "auto"
    #: --verify-head: which rows of a DSpark verify get the LM head ("auto", "lazy" or "all"; spec dspark.md §3.4)
    verify_head: str = "auto"
    #: --amx: Q8_0 products on the AMX tiles ("auto", "on" or "off"; spec ds4.md §2.9.6)
    amx: str = "auto"
    #: where the DSpark scheduler's prices start (spec dspark.md §7.4): "fresh", "engine" or "saved",
    #: and the folder of the saved ones
    scheduler_prices: str = "fresh"
    prices_dir: Path | None = None
    scheduler: bool = True
    #: the DSpark scheduler's policy the session starts with (chat --scheduler-policy; spec dspark.md §7.6)
    policy: str = DEFAULT_SCHEDULER_POLICY
    max_draft: int = 0
    #: the DSpark confidence threshold the session starts with (chat --confidence; 0 = whole blocks)
    threshold: float = 0.0
    print_stats: bool = False
    #: what the command line noted before the app started (a demo file found damaged and unpacked
    #: again, ``DemoPair.repaired``): shown in the welcome line, one line each
    notes: tuple[str, ...] = ()


# One action list feeds the footer, the key bindings and the command palette:
# (binding id, key, action, footer label, palette title, palette help, shown in the footer)
ACTIONS: tuple[tuple[str, str, str, str, str, str, bool], ...] = (
    ("generation.stop", "escape", "stop", "Stop", "Stop generating", "Stop the running turn; its text is kept", True),
    # second in the footer: a narrow window cuts the footer off, and the panes start hidden there
    ("view.panes", "f12", "toggle_panes", "Panes", "Show or hide the panes",
     "Show or hide the speculation and memory panes (hidden at first in windows under 110 columns)", True),
    ("dspark.toggle", "f2", "toggle_dspark", "DSpark", "Toggle DSpark", "Drafting on/off from the next cycle", True),
    ("dspark.scheduler", "f3", "toggle_scheduler", "Sched", "Toggle the DSpark scheduler",
     "The adaptive scheduler on/off from the next cycle", True),
    ("dspark.policy", "ctrl+r", "switch_policy", "Policy", "Switch the scheduler's policy",
     "Confidence or acceptance from the next cycle (spec dspark.md §7.6)", False),
    ("chat.trace", "f4", "toggle_trace", "Drafts", "Highlight accepted drafts",
     "Show answers token by token with accepted-draft tokens highlighted", True),
    ("chat.think", "f5", "toggle_think", "Think", "Toggle thinking mode", "Think / nothink for the next turn", True),
    ("stats.export", "f6", "export_stats", "Export", "Export DSpark stats",
     "Write the session's stats as JSON and as ds4's stats line", True),
    ("dspark.threshold_down", "f7", f"threshold({-THRESHOLD_STEP})", "Conf−", "Lower the confidence threshold",
     f"Confidence threshold −{THRESHOLD_STEP}", True),
    ("dspark.threshold_up", "f8", f"threshold({THRESHOLD_STEP})", "Conf+", "Raise the confidence threshold",
     f"Confidence threshold +{THRESHOLD_STEP}", True),
    ("dspark.draft_down", "f9", "max_draft(-1)", "Draft−", "Shorter drafts", "Max draft length −1", True),
    ("dspark.draft_up", "f10", "max_draft(1)", "Draft+", "Longer drafts", "Max draft length +1", True),
    ("chat.new", "ctrl+n", "new_chat", "New", "New chat", "Clear the conversation and its KV cache", True),
    ("chat.save", "ctrl+s", "save_transcript", "Save", "Save transcript",
     "Write the chat as Markdown and as JSON with per-turn stats", True),
    ("help.no_draft", "f1", "explain_no_draft", "Why", "Explain the no-draft reasons",
     "Why a cycle makes no draft, and what to do about each reason", False),
    ("stats.view", "ctrl+o", "view_export", "Open", "Show a stats export",
     "Show a stats JSON that F6 wrote (or a transcript) in the panes, read-only; Esc returns to the live panes",
     False),
    ("chat.context", "ctrl+g", "context_size", "Ctx", "Change the context size",
     "A new session of N tokens (the memory it needs is shown as you type); the conversation starts afresh",
     False),
)


#: the quit key (a binding of its own, with priority: it works in every screen)
QUIT_KEY = "ctrl+q"

#: what each save (``DS4App.save_failed``'s kinds) holds is discarded by these actions, which ask
#: first while that save's last attempt failed: the transcript by quitting, a new chat and a new
#: context size; the stats (the session's counters) by quitting and a new context size (a new
#: session's counters start from zero; a new chat keeps them)
DISCARDED_BY = {"transcript": ("app.quit", "chat.new", "chat.context"), "stats": ("app.quit", "chat.context")}


def key_of(action_id: str) -> str:
    """The key bound to an action of :data:`ACTIONS` (``"chat.new"``), or to ``"app.quit"``, as the
    footer writes it (``"Ctrl+N"``, ``"F6"``); KeyError for an unknown id."""
    key = {**{bid: k for bid, k, *_ in ACTIONS}, "app.quit": QUIT_KEY}[action_id]
    return "+".join(part.capitalize() if len(part) > 1 else part.upper() for part in key.split("+"))


def discarded_by(action_id: str) -> tuple[str, ...]:
    """The saves (``"transcript"``, ``"stats"``) whose content the action ``action_id`` discards
    (:data:`DISCARDED_BY`)."""
    return tuple(kind for kind, ids in DISCARDED_BY.items() if action_id in ids)


def context_full_hint() -> str:
    """What a turn that stopped because the context filled up says (its summary and a toast): the
    next question would stop after a few tokens, and what to do."""
    return (f"the context is full: {key_of('chat.new')} starts a new chat, {key_of('chat.context')} "
            f"a larger context")


@dataclass
class InterfaceCost:
    """What the interface itself cost while answers streamed (from the first text written to the
    end of decoding): the UI thread's CPU seconds over the wall seconds, and how often the text
    was written."""

    cpu_s: float = 0.0
    wall_s: float = 0.0
    text_writes: int = 0
    max_text_gap_s: float = 0.0

    @property
    def cpu_share(self) -> float | None:
        """CPU seconds of the UI thread per second of streaming (1.0: one core); None before
        MIN_COST_S of streaming."""
        return self.cpu_s / self.wall_s if self.wall_s >= MIN_COST_S else None

    @property
    def text_writes_per_s(self) -> float | None:
        return self.text_writes / self.wall_s if self.wall_s >= MIN_COST_S else None

    def add(self, other: "InterfaceCost") -> None:
        self.cpu_s += other.cpu_s
        self.wall_s += other.wall_s
        self.text_writes += other.text_writes
        self.max_text_gap_s = max(self.max_text_gap_s, other.max_text_gap_s)

    def to_dict(self) -> dict:
        return {"cpu_s": self.cpu_s, "wall_s": self.wall_s, "cpu_share": self.cpu_share,
                "text_writes": self.text_writes, "text_writes_per_s": self.text_writes_per_s,
                "max_text_gap_s": self.max_text_gap_s}


class DecodeGate:
    """When a turn's engine may start decoding (ux.md §2.4): once the question and the rows its
    answer streams into are laid out (``laid_out``), and once the prefill's end is on screen
    (``prefilled``: its progress bar gone, which lays the screen out if it was shown).  Each wait
    is at most SETTLE_MAX_S; Esc opens both (:meth:`open`)."""

    def __init__(self) -> None:
        self.laid_out = threading.Event()
        self.prefilled = threading.Event()

    def open(self) -> None:
        self.laid_out.set()
        self.prefilled.set()


class PrefillOver(Message):
    """Posted by the engine thread when its prefill is over and it waits to decode (``gate``)."""

    def __init__(self, gate: DecodeGate) -> None:
        super().__init__()
        self.gate = gate


@dataclass(frozen=True)
class EngineReady:
    engine: Any


@dataclass(frozen=True)
class LoadFailed:
    title: str
    message: str
    todo: str = "start again with a valid file."


def load_failure(exc: BaseException, options: "ChatOptions") -> tuple[str, str]:
    """The title and the "what to do" of a model that failed to load, from what really failed:
    the GPU backend (not built, no device, a fault, not enough memory), a model or support file,
    a setting that does not fit the model (``--ctx``, a max draft length), the memory or the disk
    — never "cannot open the model" for a problem that is not the model file's."""
    from ds4tui.engine import errors as E

    text = str(exc)
    if isinstance(exc, E.DeviceMemoryError):
        return ("the model does not fit the GPU memory",
                f"{exc.advice + '; or ' if exc.advice else ''}start again with --backend cpu or a smaller --ctx "
                "(`ds4tui inspect MODEL --ctx N` prints the memory plan).")
    if isinstance(exc, E.BackendUnavailableError):
        return ("the GPU backend cannot run here",
                "start again with --backend cpu (or --backend auto: the GPU when it runs, else the CPU); "
                "`ds4tui doctor` says what is missing.")
    if isinstance(exc, E.DeviceError):
        return "the GPU failed while loading", "start again with --backend cpu; `ds4tui doctor` checks the GPU."
    if isinstance(exc, E.ModelFileError):
        path = str(getattr(exc, "path", "") or "")
        which = ("the support model" if options.support and path and Path(path) == Path(options.support)
                 else "the model")
        return (f"cannot open {which}",
                "start again with a valid file (`ds4tui inspect MODEL [--mtp SUPPORT]` lists every problem).")
    if isinstance(exc, MemoryError):
        return "not enough memory to load the model", "close other programs, or use a smaller --ctx."
    if isinstance(exc, OSError):
        where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
        return f"cannot read{where}", "check the path and its permissions."
    if isinstance(exc, ValueError):
        setting = ("--ctx" if "--ctx" in text or "context" in text else
                   "the max draft length (DS4_DSPARK_MAX_DRAFT_TOKENS)" if "max draft" in text else "a setting")
        return f"{setting} does not fit this model", "start again with a value in the range the message gives."
    if isinstance(exc, E.EngineError):
        return "the engine could not start", "the message names the failing call; `ds4tui doctor` checks the build."
    return "the model could not be loaded", "the message says why."


def _stamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def write_failure(exc: OSError, path: Path, kind: str) -> str:
    """What a save that failed with ``exc`` while writing ``path`` says: the file, the reason in
    words (from ``exc.errno``: a read-only file system, no space left, no permission — in the words
    of the start-up check of ``--save-dir``, engine/fs.py — or a folder gone), what to do, and that
    until then every key that would discard the unsaved content asks first (:data:`DISCARDED_BY`);
    ``kind``: the save, ``"transcript"`` (Ctrl+S) or ``"stats"`` (F6); KeyError for another."""
    from ds4tui.engine.fs import fix_for, found_in

    retry_key = key_of({"transcript": "chat.save", "stats": "stats.export"}[kind])
    kept, it = {"transcript": ("the conversation stays", "it"), "stats": ("the stats stay", "them")}[kind]
    folder = path.parent
    code = getattr(exc, "errno", None)
    cause = {errno.EROFS: errno.EROFS, errno.ENOSPC: errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC): errno.ENOSPC,
             errno.EACCES: errno.EACCES, errno.EPERM: errno.EACCES}.get(code)
    if cause is not None:
        reason, todo = found_in(folder, cause), f"{fix_for(folder, cause)} and press {retry_key} again"
    elif code in (errno.ENOENT, errno.ENOTDIR):
        reason = f"the folder {folder} no longer exists"
        todo = f"create it again (mkdir -p {shlex.quote(str(folder))}) and press {retry_key} again"
    else:
        reason = exc.strerror or str(exc)
        todo = f"fix that and press {retry_key} again"
    detail = f"{exc.strerror}, errno {errno.errorcode.get(code, code)}" if code is not None and exc.strerror else str(exc)
    keys = ", ".join(key_of(a) for a in DISCARDED_BY[kind])
    return (f"{path}: {reason} ({detail}).\n\nWhat to do: {todo}. Until then nothing is lost: {kept} while the "
            f"app runs, and every key that would discard {it} asks first ({keys}). To save elsewhere, quit and "
            f"start again with --save-dir DIR (a writable folder; the conversation starts afresh).")


class DS4App(App):
    """``DS4App(options, engine_factory=None, telemetry=None, flush_s=FLUSH_S, memory_s=MEMORY_S)``.

    ``engine_factory(options, progress)`` returns a ``ChatEngine`` (tests pass a fake one with the
    same interface); ``telemetry``: a memory backend (default: chosen for the engine's backend,
    ``--telemetry``); ``flush_s`` / ``memory_s``: periods of the UI drain and of memory sampling
    (None: not from the timer, the caller calls :meth:`flush` / :meth:`sample_memory`).

    ``ui_cost``: the interface's cost over every turn so far (:class:`InterfaceCost`);
    ``turn_costs``: that of each turn in ``turns``."""

    TITLE = "ds4tui"
    CSS = """
    #main { height: 1fr; }
    #chat-column { width: 1fr; }
    #side { width: 58; border-left: vkey $primary-darken-2; }
    .side-column { height: auto; }
    Screen.-wider #side { width: 95; layout: horizontal; }
    Screen.-wider .side-column { width: 1fr; }
    Screen.-narrow #side { display: none; }
    Screen.-narrow.panes-shown #side { display: block; width: 100%; }
    Screen.-narrow.panes-shown #chat-column { display: none; }
    Screen.-wide.panes-hidden #side, Screen.-wider.panes-hidden #side { display: none; }
    #histograms { height: auto; }
    #status { height: 1; padding: 0 1; color: $text-muted; text-wrap: nowrap; text-overflow: ellipsis; }
    #progress { display: none; height: 1; padding: 0 1; }
    #progress.active { display: block; }
    PromptInput { margin: 0 1; }
    """
    #: Under 110 columns the panes start hidden (F12 shows them instead of the chat); from 150 on
    #: they stand in two columns, so that the ones the product is about (acceptance, histograms,
    #: stage timings, memory) are all in view without scrolling in a 150×45 window.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide"), (150, "-wider")]
    BINDINGS = [Binding(key, action, label, show=show, id=bid) for bid, key, action, label, _, _, show in ACTIONS] + [
        Binding(QUIT_KEY, "quit", "Quit", show=True, priority=True, id="app.quit"),
        Binding("minus", f"threshold({-THRESHOLD_STEP})", "Conf−", show=False, id="dspark.threshold_down_key"),
        Binding("plus", f"threshold({THRESHOLD_STEP})", "Conf+", show=False, id="dspark.threshold_up_key"),
    ]

    def __init__(self, options: ChatOptions, engine_factory: Callable | None = None, *, telemetry=None,
                 flush_s: float | None = FLUSH_S, memory_s: float | None = MEMORY_S):
        super().__init__()
        self.options = options
        self.engine_factory = engine_factory or _real_engine
        self.engine = None
        self.queue = W.EventQueue()
        self.timeline = SpecTimeline()
        self.memory_history = MemoryHistory()
        self.telemetry = telemetry
        self.flush_s, self.memory_s = flush_s, memory_s
        self.think = options.think
        self.trace = False
        self.messages: list[dict] = []
        self.turns: list[W.TurnResult] = []
        self.current: AssistantMessage | None = None
        self.last_snapshot: W.StatsSnapshot | None = None
        #: the stats export shown read-only in the panes (None: the panes are live)
        self.viewing: str | None = None
        self.last_sample = None
        self.errors: list[tuple[str, str]] = []
        self._draining = False
        self._generating = False
        self._gate = DecodeGate()  # when the running turn's engine may decode
        self._prefill_over = False  # the running turn's prefill has ended (its progress is not drawn again)
        self._panes_t = 0.0
        self._memory_t = 0.0
        self.ui_cost = InterfaceCost()
        self.turn_costs: list[InterfaceCost] = []
        self._turn_cost: InterfaceCost | None = None
        self._cost_mark: tuple[float, float] | None = None  # (wall, UI thread CPU) at the first text write
        self._last_text_t = 0.0
        self._saved_switch: float | None = None  # the interpreter's settings while a turn runs (_turn_started)
        self._saved_gc: tuple[int, ...] = gc.get_threshold()
        self._saved_blink: bool | None = None  # the prompt cursor's blinking while a turn runs
        self._frozen = False  # this app moved objects out of the collector's sight (gc.freeze)
        self._panes: dict[str, Any] = {}
        self.load_error: str | None = None
        self._signal_rc = 0
        #: the saves whose last attempt failed and what is still unsaved: "transcript" (Ctrl+S) and
        #: "stats" (F6) -> the file that could not be written; a later successful save clears it
        self.save_failed: dict[str, Path] = {}

    # ---- layout ------------------------------------------------------------------------------------

    def get_default_screen(self) -> ChatScreen:
        """(Textual's default screen, with frames drawn on demand: no wake-up between two frames.)"""
        return ChatScreen(id="_default")

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                yield ChatView(id="transcript")
                yield PrefillBar(id="progress")
                yield Static("", id="status")
                yield PromptInput(id="prompt", disabled=True)
            with VerticalScroll(id="side"):
                # two columns side by side in windows of at least 150 columns, one under the other below
                with PaneColumn(id="side-a", classes="side-column"):
                    yield KnobsPane(id="knobs")
                    yield AcceptPane("acceptance", id="accept")
                    with PaneRow(id="histograms"):
                        yield Histogram("draft len", id="draft-hist")
                        yield Histogram("accepted len", id="accepted-hist")
                    yield NoDraftPane("no-draft reasons", id="no-draft")
                    yield ThroughputPane("throughput", id="throughput")
                with PaneColumn(id="side-b", classes="side-column"):
                    yield StagesPane("stage timings", id="stages")
                    yield MemoryPane("memory", id="memory")
                    yield SupportPane("support model", id="support")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "loading…"
        self.query_one("#transcript", ChatView).mount(Static(Content.styled(
            "Opening the model…", "$text-muted"), id="welcome"))
        self._panes = {pid: self.query_one(f"#{pid}") for pid in (
            "knobs", "accept", "draft-hist", "accepted-hist", "no-draft", "throughput", "stages", "support", "memory",
            "transcript", "progress", "status", "prompt")}
        self._set_status()
        if self.flush_s or self.memory_s:
            self.run_worker(self._ticks(self.flush_s or self.memory_s), name="UI timer", group="ui-timer")
        self.run_worker(self._load, thread=True, group="load", exit_on_error=False)
        self._watch_signals()

    def _watch_signals(self) -> None:
        """A closed terminal (SIGHUP) or a kill (SIGTERM) quits like Ctrl+Q: the engine stops at its
        next cycle and the process exits (else a thread worker keeps decoding with no one to see)."""
        loop = asyncio.get_running_loop()
        self._signals: list[int] = []
        for sig in (signal.SIGHUP, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                self._signals.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such signal
                pass

    def _on_signal(self, sig: int) -> None:
        self._signal_rc = 128 + int(sig)
        if self.engine is not None:
            self.engine.stop()
        self.call_later(self._hangup if sig == signal.SIGHUP else self.quit_now)

    async def _hangup(self) -> None:
        """The terminal is gone: Textual cannot restore it (its writer thread then never drains), so
        once the engine thread has stopped the process leaves at once."""
        for w in list(self.workers):
            if w.group == "generation" and not w.is_finished:
                try:
                    await asyncio.wait_for(w.wait(), 30)
                except (WorkerCancelled, WorkerFailed, asyncio.TimeoutError):
                    pass
        os._exit(self._signal_rc)

    # ---- loading ----------------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            engine = self.engine_factory(self.options, self.queue.put)
        except Exception as exc:  # every load error is shown; the app stays up to show it
            title, todo = load_failure(exc, self.options)
            self.queue.put(LoadFailed(title, str(exc) or type(exc).__name__, todo))
            return
        self.queue.put(EngineReady(engine))

    def _load_failed(self, ev: "LoadFailed") -> None:
        self.load_error = f"{ev.title}: {ev.message}"
        self._progress(None)
        self.sub_title = "no model loaded"
        welcome = self.query("#welcome")
        if welcome:
            welcome.first().update(Content.assemble(("No model loaded: ", "bold $error"), (ev.title, "bold $error"),
                                                    "\n", ev.message, (f"\nQuit with Ctrl+Q; {ev.todo}", "$text-muted")))
        prompt = self.query_one("#prompt", PromptInput)
        prompt.disabled = True
        prompt.placeholder = "no model loaded — Ctrl+Q quits"
        self._set_status()
        for pid in ("accept", "draft-hist", "accepted-hist", "no-draft", "throughput", "stages", "support", "memory"):
            self._panes[pid].put(Content.styled("no model loaded (see the chat)", "$text-muted"))
        self._panes["knobs"].show(None, note="no model loaded (see the chat)")
        self._error(ev.title, f"{ev.message}\n\nWhat to do: {ev.todo}")

    def _gpu_options_not_applied(self, backend: str) -> str:
        """The welcome line's phrase for the GPU options asked for (``--prefill-gemm bf16/f16``,
        ``--gpu-graphs on``) that a ``backend`` other than hip does not apply (auto fell back to
        the cpu): never dropped without a word (spec platform.md §7, §8)."""
        if backend == "hip":
            return ""
        asked = ([f"--prefill-gemm {self.options.prefill_gemm}"] if self.options.prefill_gemm in ("bf16", "f16")
                 else []) + (["--gpu-graphs on"] if self.options.gpu_graphs == "on" else [])
        if not asked:
            return ""
        return f"; {' and '.join(asked)} {'do' if len(asked) > 1 else 'does'} not apply on the {backend} backend"

    def _engine_ready(self, engine) -> None:
        self.engine = engine
        info = engine.info
        self.sub_title = f"{info.model_name} · {info.backend}"
        if info.backend == "hip":  # a numerics option: always shown on the GPU (spec platform.md §7)
            self.sub_title += f" · prefill-gemm {getattr(info, 'prefill_gemm', 'off')}"
            self.sub_title += f" · graphs {getattr(info, 'gpu_graphs', 'off')}"  # spec platform.md §8
        if getattr(info, "activations", "f32") != "f32":  # a numerics option (spec ds4.md §2.9.5)
            self.sub_title += f" · activations {info.activations}"
        if info.support_status == "attached" and getattr(info, "verify_head", "all") != "all":  # spec dspark.md §3.4
            self.sub_title += f" · verify-head {info.verify_head}"
        if getattr(info, "amx", "off") == "on":  # a memory layout option (spec ds4.md §2.9.6)
            self.sub_title += " · amx"
        if self.options.numerics != "ds4":  # the numerics option (spec ds4.md §2.9): shown when not ds4's
            self.sub_title += f" · numerics {self.options.numerics}"
        if self.telemetry is None:
            try:
                self.telemetry = select_backend(self.options.telemetry, engine_backend=info.backend)
            except Exception as exc:
                self._error("memory telemetry unavailable", str(exc))
        self._progress(None)
        welcome = self.query("#welcome")
        if welcome:
            welcome.first().update(Content.styled(
                f"{info.model_name}: {info.n_layer} layers, context {info.n_ctx} tokens, {info.backend} backend"
                + (f"; {info.backend_note}" if info.backend_note else "")  # a sentence: "no usable GPU (...): ..."
                + (f"; {info.threads_note}" if getattr(info, "threads_note", "") else "")
                + (f"; prefill-gemm {info.prefill_gemm_note}" if info.backend == "hip" and getattr(info, "prefill_gemm_note", "")
                   else "")
                + (f"; prefill chunks of {info.prefill_chunk} tokens" if info.backend == "hip" and getattr(info, "prefill_chunk", 0)
                   else "")
                + (f"; graphs {info.gpu_graphs_note}" if info.backend == "hip" and getattr(info, "gpu_graphs_note", "")
                   else "") + self._gpu_options_not_applied(info.backend)
                + (f"; scheduler prices {info.scheduler_prices_note}"
                   if info.support_status == "attached" and getattr(info, "scheduler_prices_note", "") else "")
                + (f"; activations {info.activations_note}"  # auto's choice and why (a chosen one is in the title)
                   if getattr(info, "activations_note", "").startswith("auto") else "")
                + (f"; amx {info.amx_note}"  # auto's choice and why, where it turned the tiles on
                   if getattr(info, "amx_note", "").startswith("auto: on") else "")
                + (f"; drafts from {info.draft_vocab_note}"
                   if info.support_status == "attached" and getattr(info, "draft_vocab_note", "") else "")
                + (f"; verify head {info.verify_head_note}"  # a lazy asked for that the GPU does not apply
                   if info.support_status == "attached" and self.options.verify_head == "lazy"
                   and getattr(info, "verify_head", "all") != "lazy" else "")
                + "." + (f" Thinking mode is on: the model may reason until the context is full "
                         f"({key_of('chat.think')} turns it off, --nothink starts without it)." if self.think else "")
                + " Type a prompt and press Enter."
                + (f" The speculation panes are hidden in windows under 110 columns: {key_of('view.panes')} shows them."
                   if self.screen.has_class("-narrow") else "")
                + "".join(f"\nNote: {line}." for line in self.options.notes),
                "$text-muted"))
        prompt = self.query_one("#prompt", PromptInput)
        prompt.disabled = False
        prompt.focus()
        self._show_knobs()
        self.query_one("#support", SupportPane).show(info.support_status, info.support_summary, info.support_message)
        if info.support_status == "refused":
            self._error("support model refused: DSpark will not draft", info.support_message)
        self._apply_snapshot(engine.snapshot(generating=False))
        self.sample_memory()
        self._set_status()
        # what exists now (the modules, the engine, the tokenizer, the interface) lives as long as the
        # app: out of the collector's sight, a full collection no longer walks it (~0.1 s holding
        # the interpreter, which the engine thread then waits for)
        gc.collect()
        gc.freeze()
        self._frozen = True

    # ---- the UI timer ---------------------------------------------------------------------------

    def _panes_mounted(self) -> bool:
        """False while the app shuts down (timers can still fire after the widgets left)."""
        memory = self._panes.get("memory")
        return self.is_running and memory is not None and memory.is_attached

    async def _ticks(self, period: float) -> None:
        """The one UI timer: :meth:`_tick` every ``period`` seconds.  A tick that comes late runs at
        once and the next keeps its time (Textual's timer would drop it: at 5 a second, the text
        then reached the screen less than 5 times a second); a backlog of more than one is not
        run."""
        loop = asyncio.get_running_loop()
        due = loop.time() + period
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            await self._tick()
            due += period
            if due < loop.time() - period:  # more than a period behind: one tick now, on from there
                due = loop.time()

    async def _tick(self) -> None:
        """The one UI timer: the queued engine events, then the memory sample when one is due."""
        if self.flush_s:
            await self.flush()
        # while a turn runs, memory is sampled when the panes are redrawn (_apply_snapshot: one frame
        # for both); this is the fallback while no snapshot comes (a long prefill)
        due = (2 * max(self.memory_s, PANES_S) if self._generating else self.memory_s) if self.memory_s else None
        if due and time.monotonic() - self._memory_t >= due:
            self.sample_memory()

    async def flush(self) -> None:
        """Handle every queued engine event (the timer calls this every FLUSH_S)."""
        if self._draining or not self._panes_mounted():
            return
        self._draining = True
        arrived = (time.monotonic(), time.thread_time())  # when a turn's end arrives: its streaming ended here
        try:
            pending: list = []
            snap = None
            events = self.queue.drain()
            # a prefill progress that newer progress, text or the turn's end follows in this drain is
            # over: it is not drawn (showing the bar and hiding it again costs two layouts of the
            # screen while the engine decodes)
            later = False
            for i in range(len(events) - 1, -1, -1):
                ev = events[i]
                if isinstance(ev, W.PrefillProgress) and later:
                    events[i] = None
                later = later or isinstance(ev, (W.PrefillProgress, W.TokensEmitted, W.Finished))
            for ev in events:
                if ev is None:
                    continue
                if isinstance(ev, W.TokensEmitted):
                    pending.extend(ev.pieces)
                    continue
                if isinstance(ev, W.StatsSnapshot):
                    snap = ev  # only the newest one is drawn
                    continue
                if pending:  # the text before what follows (one write per flush while a turn streams)
                    await self._write(pending)
                    pending = []
                if isinstance(ev, W.PrefillProgress):
                    self._progress(ev)
                elif isinstance(ev, W.Finished):
                    cost = self._turn_ended(arrived)
                    if snap is not None:
                        self._apply_snapshot(snap)
                        snap = None
                    await self._finished(ev.result, cost)
                elif isinstance(ev, W.Failed):
                    self._error(ev.title, ev.message)
                elif isinstance(ev, W.LoadProgress):
                    self._load_progress(ev)
                elif isinstance(ev, EngineReady):
                    self._engine_ready(ev.engine)
                elif isinstance(ev, LoadFailed):
                    self._load_failed(ev)
            if pending:
                await self._write(pending)
            if snap is not None:
                self._apply_snapshot(snap)
        finally:
            self._draining = False

    async def _write(self, pieces) -> None:
        if self.current is None:
            return
        now = time.monotonic()
        if self._cost_mark is None:  # the first text of the turn: streaming starts
            self._progress(None)
            self._cost_mark = (now, time.thread_time())
            self._turn_cost = InterfaceCost()
        else:
            self._turn_cost.max_text_gap_s = max(self._turn_cost.max_text_gap_s, now - self._last_text_t)
        self._last_text_t = now
        self._turn_cost.text_writes += 1
        await self.current.add(pieces)

    # ---- the interface's own cost -----------------------------------------------------------------

    def _turn_started(self) -> None:
        """A turn starts: the engine thread gets the interpreter back quickly, and the garbage
        collector's full pass waits for the end of the turn and then walks only what the turn
        created.  The panes and the memory sample are next redrawn PANES_S / MEMORY_S from now
        (they show the turn before until then), and none of them gets shorter until the turn ends
        (:meth:`Pane.hold`: a pane's lost row would lay the screen out).  The prompt's cursor stops
        blinking until the turn ends (each blink is a frame of its own: two a second while the
        engine decodes)."""
        self._cost_mark, self._turn_cost = None, None
        self._panes_t = self._memory_t = time.monotonic()
        prompt = self._panes["prompt"]
        if self._saved_blink is None:
            self._saved_blink = prompt.cursor_blink
            prompt.cursor_blink = False
        for pane in self._held_panes():
            pane.hold(True)
        gc.freeze()
        self._frozen = True
        if self._saved_switch is None:
            self._saved_switch = sys.getswitchinterval()
            sys.setswitchinterval(min(SWITCH_S, self._saved_switch))
            self._saved_gc = gc.get_threshold()
            gc.set_threshold(*GC_THRESHOLDS)

    def _turn_ended(self, end: tuple[float, float] | None = None) -> InterfaceCost:
        """The turn's cost while it streamed (up to ``end``: the time and UI thread CPU time when
        its end arrived; default now), added to the session's; the interpreter's settings as they
        were."""
        cost = self._turn_cost or InterfaceCost()
        if self._cost_mark is not None:
            (wall, cpu), (wall_end, cpu_end) = self._cost_mark, end or (time.monotonic(), time.thread_time())
            cost.wall_s, cost.cpu_s = max(0.0, wall_end - wall), max(0.0, cpu_end - cpu)
        self._cost_mark, self._turn_cost = None, None
        self.ui_cost.add(cost)
        if self._saved_switch is not None:
            sys.setswitchinterval(self._saved_switch)
            gc.set_threshold(*self._saved_gc)
            self._saved_switch = None
        if self._panes_mounted():
            for pane in self._held_panes():
                pane.hold(False)
        if self._saved_blink is not None:
            if self._panes["prompt"].is_attached:
                self._panes["prompt"].cursor_blink = self._saved_blink
            self._saved_blink = None
        return cost

    def _held_panes(self) -> list[Pane]:
        """The panes that keep their height while a turn runs (:meth:`Pane.hold`)."""
        return [w for w in self._panes.values() if isinstance(w, Pane)]

    def live_ui_cost(self) -> InterfaceCost:
        """The session's cost including the part of the running turn that has streamed so far."""
        cost = InterfaceCost(**{k: getattr(self.ui_cost, k) for k in ("cpu_s", "wall_s", "text_writes",
                                                                         "max_text_gap_s")})
        if self._cost_mark is not None and self._turn_cost is not None:
            wall, cpu = self._cost_mark
            now = InterfaceCost(time.thread_time() - cpu, time.monotonic() - wall, self._turn_cost.text_writes,
                                self._turn_cost.max_text_gap_s)
            cost.add(now)
        return cost

    def _ui_cost_args(self) -> dict:
        """The throughput pane's interface-cost arguments: the share once answers have streamed
        MIN_COST_S, else how long they have streamed so far."""
        cost = self.live_ui_cost()
        return {"ui_share": cost.cpu_share, "ui_streamed_s": cost.wall_s, "ui_min_s": MIN_COST_S}

    def _apply_snapshot(self, snap: W.StatsSnapshot) -> None:
        """Every snapshot feeds the timeline; the panes redraw at most every PANES_S while a turn
        runs (a redraw costs the UI thread far more than reading a snapshot), and only the panes
        whose text changed are repainted; while a turn runs the memory pane is sampled with them."""
        self.last_snapshot = snap
        self.timeline.add(snap)
        if self.viewing is not None:  # an export is on show: the live panes wait until it is closed
            return
        now = time.monotonic()
        if snap.generating and now - self._panes_t < PANES_S:
            return
        self._panes_t = now
        info = self.engine.info if self.engine is not None else None
        self._draw_panes(snap, self.timeline.view(), info.support_status if info else "none")
        if snap.generating and self.memory_s:
            # the memory pane in the same frame: a frame that repaints a pane far from the streaming
            # text also renders every widget between the two (Textual repaints the bounding box)
            self.sample_memory()
        if snap.knobs is not None:
            self._show_knobs(snap.knobs)
        self._set_status()

    def _draw_panes(self, snap: W.StatsSnapshot, view, support_status: str, backend: str | None = None) -> None:
        """``backend``: where the stats were measured (the drafter's steps the stage pane lists before
        the first cycle); None: this engine's."""
        st = snap.dspark
        if backend is None:
            backend = self.engine.info.backend if self.engine is not None else "cpu"
        p = self._panes
        p["accept"].show(st, view, support_status=support_status)
        p["draft-hist"].show(st.draft_len_hist if st is not None else ())
        p["accepted-hist"].show(st.accepted_len_hist if st is not None else ())
        p["stages"].show(st, backend=backend)
        p["no-draft"].show(st, support_status=support_status, knobs=snap.knobs)
        p["throughput"].show(view, st, n_tokens=snap.n_tokens, n_ctx=snap.n_ctx,
                             **self._ui_cost_args())

    # ---- the context size ------------------------------------------------------------------------

    def context_size_problem(self, text: str) -> str | None:
        """Why ``text`` is not a context size this model takes (not a whole number, or outside
        2..the model's context length), in the context dialog's words; None when it is one."""
        e = self.engine
        limit = e.engine.config.context_length if e is not None and hasattr(e, "engine") else None
        try:
            n = int(text)
        except ValueError:
            return f"a whole number of tokens, 2..{limit or 'the model’s context length'}"
        if n < 2 or (limit is not None and n > limit):
            return f"out of range: 2..{limit or 'the model’s context length'} tokens"
        return None

    def describe_context(self, text: str) -> str:
        """What a session of ``text`` tokens would hold (the memory plan), for the context dialog."""
        problem = self.context_size_problem(text)
        if problem is not None:
            return problem
        e, n = self.engine, int(text)
        if e is None or not hasattr(e, "session_plan"):
            return ""
        b = e.session_plan(n)
        # scratch as the memory pane then shows it (the session's memory().scratch): the pass's buffers, the
        # host buffers and what the engine expanded at open
        scratch = b["scratch"] + b["host"] + b.get("engine", 0)
        gpu = e.info.backend == "hip"
        amx = b.get("amx_copies", 0)  # the amx option's copies of the weights, as the memory pane lists them
        text = (f"a session of {n} tokens holds {format_bytes(b['kv'] + b['compressor'] + scratch)} beside the "
                f"weights{f' and their amx copies ({format_bytes(amx)}, the same at any size)' if amx else ''}: "
                f"KV window ring {format_bytes(b['kv'])}, compressed KV {format_bytes(b['compressor'])}, scratch "
                f"{format_bytes(scratch)}" + (f" ({format_bytes(b['host'])} of it in host memory)" if gpu else ""))
        if gpu:  # inspect's budget is the GPU's memory: no check to offer on the CPU
            text += f"; `ds4tui inspect {shlex.quote(e.info.model_path)} --ctx {n}` checks it against the GPU's memory"
        return text

    def action_context_size(self) -> None:
        """Ask for a context size (the memory a size needs shown as it is typed), then
        :meth:`context_size_entered`."""
        if self.engine is None or not hasattr(self.engine, "set_context"):
            self.notify("the model is not loaded", severity="warning")
            return
        if self._generating:
            self.notify("a turn is running: Esc stops it first", severity="warning")
            return
        self.push_screen(AskPath("Context size (tokens)", str(self.engine.info.n_ctx),
                                 "Enter starts a new session of that size: the conversation starts afresh, "
                                 "the knobs and sampling stay; Esc cancels", describe=self.describe_context),
                         self.context_size_entered)

    async def context_size_entered(self, text: str | None) -> None:
        """The size typed after Ctrl+G: a new session of ``text`` tokens (:meth:`set_context`).  When
        what it discards was never saved (:meth:`unsaved_work`: the transcript, and the stats, as the
        new session's counters start from zero), a dialog asks first, as quitting does: change it
        anyway (Ctrl+G again) or stay (Esc: the conversation and the session as they were).  A size
        the model does not take (:meth:`context_size_problem`) is refused by :meth:`set_context`
        without asking: nothing would be lost."""
        if not text:
            return
        unsaved = self.unsaved_work(discarded_by("chat.context")) if self.context_size_problem(text) is None else []
        if unsaved:
            self.push_screen(ConfirmContext(f"Change the context size to {int(text)} tokens without saving?",
                                            self._unsaved_message("if you change the context size now", unsaved)),
                             lambda go: self.call_later(self.set_context, text) if go else None)
            return
        await self.set_context(text)

    async def set_context(self, text: str | None) -> None:
        """A new session of ``text`` tokens, without asking (:meth:`context_size_entered` asks
        first); the chat is cleared as Ctrl+N does."""
        if not text:
            return
        try:
            n = int(text)
        except ValueError:  # int() said "invalid literal for int() with base 10: 'abc'"
            self._error("cannot change the context size", f"context size: expected "
                        f"{self.context_size_problem(text)}, found {text.strip()!r}; the session keeps its size")
            return
        try:
            info = self.engine.set_context(n)
        except (ValueError, W.S.EngineError) as exc:
            self._error("cannot change the context size", str(exc))
            return
        # the new session's counters start at 0, and so do the figures drawn from the old one's:
        # its rates, the interface's cost (the next export's too) and the memory it held
        self.timeline = SpecTimeline()
        self.ui_cost = InterfaceCost()
        await self.new_chat()
        self.sample_memory()
        self.notify(f"context {info.n_ctx} tokens — a new session; {self.describe_context(str(info.n_ctx))}",
                    timeout=8)

    # ---- a stats export, shown read-only ----------------------------------------------------------

    def action_view_export(self) -> None:
        exports = sorted(Path(self.options.save_dir).glob("ds4tui-stats-*.json"), key=lambda f: f.stat().st_mtime)
        default = str(exports[-1]) if exports else str(Path(self.options.save_dir) / "ds4tui-stats-.json")
        self.push_screen(AskPath("Show a stats export (read-only)", default,
                                 "a JSON that F6 wrote (or a Ctrl+S transcript); Enter shows it, Esc cancels"),
                         self.view_export)

    #: while an export is shown: the panes drawn from it, and those that stay live
    EXPORT_PANES = ("knobs", "accept", "draft-hist", "accepted-hist", "no-draft", "throughput", "stages")
    LIVE_PANES = ("memory", "support")

    def view_export(self, path: str | None) -> None:
        """Show the stats export at ``path`` in the panes, read-only, until Esc (or the next turn):
        its knobs, counters and figures; the memory and support panes stay live and say so."""
        if not path:
            return
        expected = "expected a stats export that F6 wrote (ds4tui-stats-*.json) or a Ctrl+S transcript (ds4tui-chat-*.json)"
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            self._error("cannot show the export", f"{path}: not a text file; {expected}")
            return
        except OSError as exc:
            self._error("cannot show the export", f"{path}: cannot read it ({exc.strerror or exc}); {expected}")
            return
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            self._error("cannot show the export", f"{path}: not JSON ({exc.msg} at line {exc.lineno} column "
                        f"{exc.colno}); {expected}")
            return
        try:
            if isinstance(d, dict) and str(d.get("format", "")).startswith("ds4tui-chat/"):
                d = d.get("session") or {}
            snap = W.StatsSnapshot.from_export(d)
            interface = d.get("interface") or {}
            ui_share = interface.get("cpu_share") if isinstance(interface, dict) else None
            ui_share = float(ui_share) if ui_share is not None else None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self._error("cannot show the export", f"{path}: {exc}; {expected}")
            return
        self.viewing = str(path)
        name = Path(path).name
        timeline = SpecTimeline()
        timeline.add(snap)
        # an export holds the session's counters, no recent window: its "recent" rate would repeat the session's
        view = _replace(timeline.view(), recent_accept=None)
        self._draw_panes(snap, view, str(d.get("support_status") or "none"), str(d.get("backend") or "cpu"))
        self._panes["throughput"].show_export(snap.stats, snap.dspark, n_tokens=snap.n_tokens, n_ctx=snap.n_ctx,
                                              ui_share=ui_share)
        # knobs changed during the exported session (its knob_events after cycle 0): the ones shown are its last,
        # and its counters mix them with the earlier ones
        changed = sorted({e.cycle for e in snap.events if e.cycle > 0})
        at = ", ".join(map(str, changed[:4])) + (", …" if len(changed) > 4 else "")
        # knobs set after the last change a cycle took up (the session ended, or a new chat began, before one
        # ran with them): no cycle of the export ran with the knobs shown
        in_force = d.get("knobs_in_force")
        in_force = in_force if isinstance(in_force, dict) else snap.events[-1].knobs.to_dict() if snap.events else None
        after = in_force is not None and snap.knobs is not None and in_force != snap.knobs.to_dict()
        note = (f"no DSpark knobs recorded in {name} (Esc: live)" if snap.knobs is None
                else f"the knobs of {name} at its end, set after its last cycle: no cycle ran with them; its "
                     f"counters are of {knobs_state(DSparkKnobs(**knob_fields(in_force)))}"
                     + (f" (changed at cycle {at})" if changed else "") + " (read-only; Esc: live)" if after
                else f"the knobs of {name} at its end, changed at cycle {at}: its counters mix them with the earlier "
                     f"ones (read-only; Esc: live)" if changed
                else f"the knobs of {name} (read-only; Esc: live)")
        block = snap.dspark.block_size if snap.dspark is not None else 16
        self._panes["knobs"].show(snap.knobs, note=note, block=block or 16, read_only=True)
        for pid in self.EXPORT_PANES:
            self._panes[pid].border_subtitle = name
        for pid in self.LIVE_PANES:
            self._panes[pid].border_subtitle = "live"
        self._set_status()
        self.notify(f"showing {name} read-only — Esc returns to the live panes", timeout=4)
        # a knob that had the focus is disabled now (and the file dialog, closing, gave it back the focus):
        # the prompt takes the keys, once the screen has settled
        self.call_after_refresh(self._refocus_if_lost)

    def _refocus_if_lost(self) -> None:
        if self.focused is None or self.focused.disabled:
            self._focus_prompt()

    def close_export(self) -> None:
        """Back to the live panes."""
        if self.viewing is None:
            return
        self.viewing = None
        for pid in self.EXPORT_PANES + self.LIVE_PANES:
            self._panes[pid].border_subtitle = None
        snap = self.last_snapshot
        if snap is not None:
            info = self.engine.info if self.engine is not None else None
            self._draw_panes(snap, self.timeline.view(), info.support_status if info else "none")
        self._show_knobs()
        self._set_status()
        if self.focused is None or self.focused.disabled or self.focused.id not in ("prompt", *KNOB_CONTROLS):
            # a knob had the focus when the export came up: its control was disabled, the focus went to the
            # transcript (or, from the policy's selector, nowhere) and stayed there, and what was typed next
            # went nowhere
            self._focus_prompt()

    def _show_knobs(self, knobs=None) -> None:
        e = self.engine
        if e is None or self.viewing is not None:  # an export's knobs are on show until Esc
            return
        knobs = knobs if knobs is not None else e.knobs
        if knobs is None:
            note = ("support model refused — see the support pane" if e.info.support_status == "refused"
                    else "no support model: start with --mtp SUPPORT.gguf")
        else:
            note = "changes apply at the next cycle"
        self._panes["knobs"].show(knobs, note=note, block=e.info.block_size or 16)

    def sample_memory(self) -> None:
        if self.telemetry is None or self.engine is None or not self._panes_mounted():
            return
        self._memory_t = time.monotonic()
        s = self.telemetry.sample()
        self.last_sample = s
        self.memory_history.append(s)
        main = "gtt_used_b" if s.gtt_total_b is not None else "vram_used_b" if s.vram_total_b is not None else "rss_b"
        self._panes["memory"].show(s, self.memory_history.series(main), self.engine.memory())

    def _progress(self, ev) -> None:
        """Show the prefill's progress ``ev`` (None: hide the bar).  A prefill that has ended (all
        its tokens done, or the engine said so: ``PrefillOver``) is not drawn: the bar leaves."""
        bar = self._panes["progress"]
        if ev is None or self._prefill_over or ev.done >= ev.total:
            bar.show(False)
            return
        bar.show(True)
        bar.update(total=max(1, ev.total), progress=ev.done)
        self._set_status(f"prefill {ev.done}/{ev.total} tokens" + (f" ({ev.reused} reused from the KV cache)"
                                                                   if ev.reused else ""))
        if self.engine is not None:  # the context counts the prompt as it is prefilled
            snap = self.last_snapshot
            self._panes["throughput"].show(self.timeline.view(), snap.dspark if snap is not None else None,
                                           n_tokens=ev.reused + ev.done, n_ctx=self.engine.info.n_ctx,
                                           **self._ui_cost_args())

    def _load_progress(self, ev: W.LoadProgress) -> None:
        bar = self._panes["progress"]
        bar.show(True)
        bar.update(total=max(1, ev.total), progress=ev.done)
        amount = (f"{format_bytes(ev.done)} of {format_bytes(ev.total)}" if ev.unit == "byte"
                  else f"step {ev.done + 1} of {ev.total}")
        self._set_status(f"loading: {ev.phase} ({amount})")

    def _set_status(self, text: str | None = None) -> None:
        if text is None:
            parts = []
            if self.engine is None:  # loading, or the load failed (F4/F5 redraw the line: it stays said)
                parts.append("no model loaded · Ctrl+Q quits" if self.load_error else "loading…")
            else:
                parts.append("generating (Esc stops)" if self._generating else "ready")
            parts.append("think" if self.think else "nothink")
            # each part short: the line is one row of the chat column (50 columns in a 110-column window)
            if self.trace:
                parts.append("highlight")  # (F4: accepted drafts highlighted)
            if self.viewing is not None:  # (the file's name is on the panes' borders)
                parts.append("export view (Esc)")
            text = " · ".join(parts)
        set_line(self._panes["status"], text)

    def _error(self, title: str, message: str) -> None:
        self.errors.append((title, message))
        self.push_screen(ErrorDialog(title, message))

    # ---- chat -----------------------------------------------------------------------------------------

    @on(Input.Submitted, "#prompt")
    async def _submit(self, event: Input.Submitted) -> None:
        prompt = self.query_one("#prompt", PromptInput)
        text = prompt.question(event.value).strip()  # a pasted text's line breaks as they were
        if not text:
            return
        if self.engine is None:
            self.notify("the model is not loaded", severity="warning")
            return
        if self._generating:
            self.notify("a turn is running: Esc stops it", severity="warning")
            return
        prompt.remember(text)
        prompt.value = ""
        view = self.query_one("#transcript", ChatView)
        await view.mount(UserMessage(text))
        self.current = AssistantMessage(trace=self.trace)
        await view.mount(self.current)
        view.scroll_end(animate=False)
        # the engine prefills at once and decodes once the question is laid out and the rows its
        # answer streams into are reserved (SETTLE_FRAMES frames, each after the layouts the one
        # before asked for; a frame with nothing to do passes at once), and once the prefill's
        # progress bar has left the screen (_on_prefill_over): the first text then repaints those
        # rows, and no layout of the screen runs beside the engine's decode cycles
        gate = DecodeGate()
        self._gate, self._prefill_over = gate, False
        self._after_frames([self.current.size_live_text], gate.laid_out)
        self.messages.append({"role": "user", "content": text})
        self._generating = True
        self._set_status()
        self.close_export()  # a new turn: the panes go live again
        self._turn_started()
        self.run_worker(partial(self._turn, list(self.messages), self.think, gate), thread=True,
                        group="generation", exclusive=True, exit_on_error=False)

    def _after_frames(self, first_steps: list, done: threading.Event) -> None:
        """Run ``first_steps`` one per frame, then let frames pass until SETTLE_FRAMES have, then
        set ``done`` (at once if ``done`` is set meanwhile: Esc)."""
        steps = list(first_steps) + [None] * (SETTLE_FRAMES - len(first_steps))

        def frame() -> None:
            step = steps.pop(0)
            if step is not None:
                step()
            if steps and not done.is_set():
                self.call_after_refresh(frame)
            else:
                done.set()

        self.call_after_refresh(frame)

    def _before_decode(self, gate: DecodeGate) -> None:
        """(The engine thread, after the prefill.)  Wait until the question is laid out, then tell
        the interface the prefill is over and wait until its progress bar has left the screen."""
        gate.laid_out.wait(SETTLE_MAX_S)
        if not gate.prefilled.is_set() and self.post_message(PrefillOver(gate)):  # (thread-safe)
            gate.prefilled.wait(SETTLE_MAX_S)

    @on(PrefillOver)
    def _on_prefill_over(self, message: PrefillOver) -> None:
        """The prefill is over: its progress bar leaves the screen now (a layout, if it was shown),
        and the engine decodes after the frames that follow."""
        if message.gate is self._gate:
            self._prefill_over = True
            self._progress(None)
            self._set_status()  # (what the prefill's progress said before: one row)
        self._after_frames([], message.gate.prefilled)

    def _turn(self, messages, think, gate: DecodeGate) -> None:
        try:  # the prefill runs while the interface lays the turn out; decoding waits for it
            self.engine.run_turn(messages, self.queue, think=think, system=self.options.system,
                                 max_tokens=self.options.max_tokens,
                                 before_decode=partial(self._before_decode, gate))
        except Exception as exc:  # a bug, not an engine error: show it and keep the app usable
            self.queue.put(W.Failed("generation failed", f"{type(exc).__name__}: {exc}"))
            self.queue.put(W.Finished(0, W.TurnResult(0, 0, 0, (), (), "", "", "error", 0.0, None, 0.0)))

    async def _finished(self, r: W.TurnResult, cost: InterfaceCost) -> None:
        self._generating = False
        self._progress(None)
        if self.current is not None:
            tps = r.decode_tokens_per_s
            n = len(r.ids)
            if r.reason == "error" and not n:
                summary = "not answered (see the error); this prompt is not part of the conversation"
            elif r.reason == "stopped" and not n:
                summary = "stopped before the answer began; this prompt is not part of the conversation"
            else:
                summary = (f"{plural(n, 'token')} · {r.n_draft} from accepted drafts ({100 * r.n_draft / n:.0f}% of "
                           f"output tokens)"
                           if n else "0 tokens")
                summary += (f" · {tps:.1f} t/s" if tps else "") + f" · prefill {r.prefill_s:.2f} s · stop: {r.reason}"
                if r.reason == "ctx":
                    summary += f" · {context_full_hint()}"
                said = [r.scheduler_prices_retime,  # what the welcome line said at open, for this answer's session
                        prices.retimed_words(list(r.scheduler_prices_retimed))]  # and what its drafting measured
                if any(said):
                    summary += " · scheduler prices: " + "; ".join(x for x in said if x)
            await self.current.finish(summary)
            if r.reason == "ctx":  # once for this turn: the next question would stop after a few tokens
                self.notify(context_full_hint(), title="context full", severity="warning", timeout=10)
        if r.reason in ("error", "stopped") and not r.ids:
            # nothing was generated (an error, or Esc during the prefill): the prompt leaves the
            # conversation, so the next turn does not prefill it again
            if self.messages and self.messages[-1]["role"] == "user":
                self.messages.pop()
        else:
            self.messages.append({"role": "assistant", "content": r.answer, "reasoning": r.reasoning})
            self.turns.append(r)
            self.turn_costs.append(cost)
        self.current = None
        self._set_status()

    # ---- actions -----------------------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.focused is not None and self.focused.id in KNOB_CONTROLS:
            self._focus_prompt()  # Esc in a knob's field leaves it (its typed value is dropped)
            return
        if self.viewing is not None and not self._generating:
            self.close_export()
            return
        if self.engine is not None and self._generating:
            self._gate.open()  # (a turn waiting for its layout stops at once)
            self.engine.stop()
            self._set_status("stopping…")

    def _knob(self, *, also: str = "", **kw) -> bool:
        """Set DSpark knobs; a toast says what changed (or why not), then ``also``.  True if they were set."""
        if self.engine is None:
            return False
        now = self.engine.knobs
        if now is not None and all(getattr(now, k, None) == v for k, v in kw.items()):  # e.g. 5 typed where it is 5
            self._show_knobs(now)
            self.notify(knob_words(kw, unchanged=True) + also, timeout=2)
            return True
        try:
            knobs = self.engine.set_dspark(**kw)
        except Exception as exc:
            self.notify(str(exc), title="DSpark knobs", severity="error", timeout=8)
            return False
        self._show_knobs(knobs)
        snap = self.last_snapshot
        if self.viewing is None and snap is not None and self._panes_mounted():  # its advice follows the knobs
            self._panes["no-draft"].show(snap.dspark, support_status=self.engine.info.support_status, knobs=knobs)
        self.notify(knob_words(kw) + also, timeout=4 if also else 2)
        return True

    def _focus_prompt(self) -> None:
        prompt = self.query_one("#prompt", PromptInput)
        if not prompt.disabled:
            prompt.focus()

    def action_toggle_dspark(self) -> None:
        if self.engine is not None and self.engine.knobs is not None:
            self._knob(enabled=not self.engine.knobs.enabled)
        else:
            self._knob(enabled=True)

    def action_toggle_scheduler(self) -> None:
        if self.engine is not None and self.engine.knobs is not None:
            self._knob(scheduler=not self.engine.knobs.scheduler)
        else:
            self._knob(scheduler=True)

    def action_switch_policy(self) -> None:
        k = self.engine.knobs if self.engine is not None else None
        now = k.policy if k is not None else DEFAULT_SCHEDULER_POLICY
        off = k is not None and not k.scheduler
        self._knob(policy=SCHEDULER_POLICIES[(SCHEDULER_POLICIES.index(now) + 1) % len(SCHEDULER_POLICIES)],
                   also="; the scheduler is off: its policy decides nothing until F3 turns it on" if off else "")

    def action_threshold(self, step: float) -> None:
        k = self.engine.knobs if self.engine is not None else None
        if k is None:
            self._knob(threshold=0.0)
            return
        value = round(min(1.0, max(0.0, k.threshold + step)), 2)
        if value == k.threshold:  # (a typed 1e-09 steps down to 0: it is not at the minimum yet)
            self.notify(f"confidence threshold is at its {'maximum' if step > 0 else 'minimum'}, "
                        f"{threshold_text(value)}", timeout=3)
            return
        self._knob(threshold=value)

    def action_max_draft(self, step: int) -> None:
        k = self.engine.knobs if self.engine is not None else None
        if k is None:
            self._knob(max_draft=1)
            return
        block = self.engine.info.block_size or 1
        value = min(max(1, k.max_draft + step), block)
        if value == k.max_draft:
            self.notify(f"max draft length is at its maximum, {value} (the support model's block size)" if step > 0
                        else f"max draft length is at its minimum, {value}", timeout=3)
            return
        self._knob(max_draft=value)

    @on(Switch.Changed, "#dspark")
    def _dspark_switch(self, event: Switch.Changed) -> None:
        self._knob(enabled=event.value)

    @on(Switch.Changed, "#scheduler")
    def _scheduler_switch(self, event: Switch.Changed) -> None:
        self._knob(scheduler=event.value)

    @on(Select.Changed, "#policy")
    def _policy_select(self, event: Select.Changed) -> None:
        """A policy chosen in the knobs pane: applied (back to the prompt: :meth:`_policy_closed`)."""
        if event.value in SCHEDULER_POLICIES:
            self._knob(policy=event.value)

    @on(PolicySelect.Closed)
    def _policy_closed(self) -> None:
        """The selector's list closed (a choice, the one shown too, or Esc): the prompt takes the keys, as
        after Enter or Esc in a knob's field."""
        self.call_after_refresh(self._focus_prompt)

    @on(Input.Submitted, "#threshold")
    def _threshold_input(self, event: Input.Submitted) -> None:
        """Enter in the confidence field: applied, back to the prompt; a bad value stays in the field,
        marked invalid, to be corrected (Esc or leaving the field shows the value in force again), and
        the message quotes what was typed and the value that stays."""
        if event.validation_result is not None and not event.validation_result.is_valid:
            typed = event.value.strip()
            comma = " (write the decimal point as '.')" if "," in typed else ""
            k = self.engine.knobs if self.engine is not None else None
            stays = f"; it stays {threshold_text(k.threshold)} (Esc shows it again)" if k is not None else ""
            self.notify(f"confidence threshold: a number in [0, 1], found {typed or 'nothing'}{comma}{stays}",
                        severity="error")
            return
        if self._knob(threshold=float(event.value) + 0.0):  # + 0.0: "-0" is 0, not -0.00 in the toast
            self._focus_prompt()

    @on(Input.Submitted, "#max-draft")
    def _max_draft_input(self, event: Input.Submitted) -> None:
        """Enter in the max-draft field: as the confidence field's (:meth:`_threshold_input`)."""
        if event.validation_result is not None and not event.validation_result.is_valid:
            block = self.engine.info.block_size if self.engine is not None else 16
            k = self.engine.knobs if self.engine is not None else None
            stays = f"; it stays {k.max_draft} (Esc shows it again)" if k is not None else ""
            self.notify(f"max draft length: an integer 1..{block}, found {event.value.strip() or 'nothing'}{stays}",
                        severity="error")
            return
        if self._knob(max_draft=int(event.value)):
            self._focus_prompt()

    @on(Input.Blurred, "#threshold, #max-draft")
    def _knob_input_left(self) -> None:
        self._show_knobs()

    def action_explain_no_draft(self) -> None:
        snap = self.last_snapshot
        st = snap.dspark if snap is not None else None
        self.push_screen(InfoDialog("Why cycles make no draft", explain_reasons(st)))

    def action_toggle_panes(self) -> None:
        screen = self.screen
        screen.toggle_class("panes-shown" if screen.has_class("-narrow") else "panes-hidden")
        if screen.has_class("-narrow") and not screen.has_class("panes-shown"):
            # the chat is back in place of the panes: typing goes to the prompt again (the focus had moved
            # off it while it was hidden, and keys typed then went nowhere)
            self.call_after_refresh(self._focus_prompt)

    @on(ChatScreen.Resized)
    def _screen_resized(self) -> None:
        self.call_after_refresh(self._typing_to_prompt)

    def _typing_to_prompt(self) -> None:
        """After the chat's screen took its new size and breakpoint classes: a window widened past 110
        columns while F12 showed the panes in place of the chat brings the chat back with the focus still
        on a pane, so the prompt gets it again, where nothing that takes typing has it (only on the chat's
        screen: a dialog keeps its own focus)."""
        screen = self.screen
        if len(self.screen_stack) > 1 or isinstance(self.focused, Input):
            return
        if screen.has_class("-narrow") and screen.has_class("panes-shown"):  # the panes in the chat's place
            return
        self._focus_prompt()

    def action_toggle_trace(self) -> None:
        self.trace = not self.trace
        for m in self.query(AssistantMessage):
            m.set_trace(self.trace)
        self._set_status()

    def action_toggle_think(self) -> None:
        self.think = not self.think
        self.notify(f"{'thinking' if self.think else 'nothink'} mode from the next turn", timeout=2)
        self._set_status()

    async def action_new_chat(self) -> None:
        """New chat (:meth:`new_chat`); when the transcript's save failed and the conversation was
        never saved (:meth:`unsaved_work`), a dialog asks first, as quitting does: a new chat anyway
        (Ctrl+N again) or stay (Esc).  The stats are not asked about: a new chat keeps the counters."""
        if self._generating:
            self.notify("a turn is running: Esc stops it first", severity="warning")
            return
        unsaved = self.unsaved_work(discarded_by("chat.new"))
        if unsaved:
            self.push_screen(ConfirmNewChat("New chat without saving?",
                                            self._unsaved_message("if you start a new chat now", unsaved)),
                             lambda go: self.call_later(self.new_chat) if go else None)
            return
        await self.new_chat()

    async def new_chat(self) -> None:
        """Clear the conversation and the engine's KV cache (the counters keep running)."""
        if self._generating:
            self.notify("a turn is running: Esc stops it first", severity="warning")
            return
        if self.engine is not None:
            self.engine.new_chat()
            self._apply_snapshot(self.engine.snapshot(generating=False))
        self.messages.clear()
        self.turns.clear()
        self.turn_costs.clear()
        await self.query_one("#transcript", ChatView).remove_children()
        # the old conversation's objects were frozen at each turn's start (_turn_started): collect them
        if self._frozen:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
        self.notify("new chat", timeout=2)

    def _stats_payload(self) -> tuple[dict, str | None]:
        snap = self.last_snapshot if self._generating or self.engine is None else self.engine.snapshot(generating=False)
        if snap is None:
            return {}, None
        d = {
            "model": self.engine.info.model_path if self.engine else self.options.model,
            "support": self.engine.info.support_path if self.engine else self.options.support,
            "support_status": self.engine.info.support_status if self.engine else "none",
            "backend": self.engine.info.backend if self.engine else None,
            "numerics": self.options.numerics,
            # the numerics options in force, under generate --json's names (compare lists a change)
            "activations": self.engine.info.activations if self.engine else self.options.activations,
            "prefill_gemm": self.engine.info.prefill_gemm if self.engine else None,
            "prefill_gemm_note": self.engine.info.prefill_gemm_note if self.engine else None,
            "draft_vocab": getattr(self.engine.info, "draft_vocab", 0) if self.engine else None,
            "draft_vocab_note": getattr(self.engine.info, "draft_vocab_note", "") if self.engine else None,
            "verify_head": getattr(self.engine.info, "verify_head", "all") if self.engine else self.options.verify_head,
            "amx": getattr(self.engine.info, "amx", "off") if self.engine else self.options.amx,
            "gpu_graphs": self.engine.info.gpu_graphs if self.engine else None,
            "n_threads": self.engine.info.n_threads if self.engine else (self.options.threads or None),
            "system": self.options.system or None,
            "sampling": {"temperature": self.options.temperature, "top_k": self.options.top_k,
                         "top_p": self.options.top_p, "min_p": self.options.min_p, "seed": self.options.seed},
            "knobs": snap.knobs.to_dict() if snap.knobs is not None else None,
            # what the counted cycles ran with: not the knobs above while a change waits for a cycle
            "knobs_in_force": _knobs_dict(self.engine.knobs_in_force(snap.events)
                                          if hasattr(self.engine, "knobs_in_force") else None),
            # where the scheduler started: two sessions with the same knobs draft differently when
            # one starts from the prices the other kept (compare's scheduler_start)
            **(getattr(self.engine, "scheduler_start", None) or {}),
            "knob_events": [{"cycle": e.cycle, **e.knobs.to_dict()} for e in snap.events],
            "stats": snap.stats.to_dict(),
            # the session's decode rate (its counters: tokens over the engine's decode time), as generate's
            "decode_tokens_per_s": (1000.0 * snap.stats.n_decode_tokens / snap.stats.decode_ms
                                    if snap.stats.decode_ms > 0 else None),
            "dspark_stats": snap.dspark.to_dict() if snap.dspark is not None else None,
            "n_tokens": snap.n_tokens,
            "n_ctx": snap.n_ctx,
            # the counters' run: exports with one id count from the same start (compare warns)
            "counters_id": getattr(self.engine, "counters_id", None),
            # the app's own cost while answers streamed: the UI thread's CPU seconds per second
            "interface": self.live_ui_cost().to_dict(),
        }
        return d, format_line(snap.dspark) if snap.dspark is not None else None

    def action_export_stats(self) -> None:
        payload, line = self._stats_payload()
        if not payload:
            self.notify("no stats yet", severity="warning")
            return
        base = Path(self.options.save_dir) / f"ds4tui-stats-{_stamp()}"
        try:
            base.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
            if line is not None:
                base.with_suffix(".txt").write_text(line + "\n")
        except OSError as exc:
            path = Path(exc.filename) if getattr(exc, "filename", None) else base.with_suffix(".json")
            self.save_failed["stats"] = path
            self._error("cannot write the stats", write_failure(exc, path, "stats"))
            return
        self.save_failed.pop("stats", None)
        self.notify(f"wrote {base}.json" + (f" and {base.name}.txt" if line is not None else ""), timeout=6)

    def transcript_markdown(self) -> str:
        info = self.engine.info if self.engine is not None else None
        out = [f"# ds4tui chat — {info.model_name if info else self.options.model}", ""]
        if info is not None:
            out += [f"- model: `{info.model_path}` ({info.backend} backend, context {info.n_ctx})",
                    f"- support: `{info.support_path}` ({info.support_status})" if info.support_path else "- support: none",
                    ""]
        turns = iter(self.turns)
        for m in self.messages:
            if m["role"] == "user":
                out += ["## User", "", m["content"], ""]
                continue
            r = next(turns, None)
            out += ["## Assistant", ""]
            if m.get("reasoning"):
                out += ["<details><summary>reasoning</summary>", "", m["reasoning"], "", "</details>", ""]
            out += [m["content"], ""]
            if r is not None:
                tps = r.decode_tokens_per_s
                out += [f"*{len(r.ids)} tokens, {r.n_draft} from accepted drafts"
                        + (f", {tps:.1f} t/s" if tps else "") + f", stop: {r.reason}*", ""]
        return "\n".join(out)

    def transcript_json(self) -> dict:
        payload, line = self._stats_payload()
        turns = iter(zip(self.turns, self.turn_costs))
        msgs = []
        for m in self.messages:
            if m["role"] == "assistant":
                r, cost = next(turns, (None, None))
                msgs.append({**m, "stats": r.to_dict() if r is not None else None,
                             "interface": cost.to_dict() if cost is not None else None})
            else:
                msgs.append(dict(m))
        return {"format": "ds4tui-chat/1", "saved": _dt.datetime.now().isoformat(timespec="seconds"),
                "messages": msgs, "session": payload, "dspark_line": line}

    def action_save_transcript(self) -> None:
        if not self.messages:
            self.notify("nothing to save yet", severity="warning")
            return
        base = Path(self.options.save_dir) / f"ds4tui-chat-{_stamp()}"
        try:
            base.with_suffix(".md").write_text(self.transcript_markdown())
            base.with_suffix(".json").write_text(json.dumps(self.transcript_json(), indent=2) + "\n")
        except OSError as exc:
            path = Path(exc.filename) if getattr(exc, "filename", None) else base.with_suffix(".md")
            self.save_failed["transcript"] = path
            self._error("cannot save the transcript", write_failure(exc, path, "transcript"))
            return
        self.save_failed.pop("transcript", None)
        self.notify(f"saved {base}.md and {base.name}.json", timeout=6)

    def get_system_commands(self, screen):
        """Textual's commands (theme, keys, maximise), with its Quit and Screenshot made the app's: Quit
        with its key (it asks first where a save failed, as Ctrl+Q does), a screenshot into --save-dir
        (Textual's went to a downloads folder that may not exist, and said only "Failed"); then the
        app's actions with their keys."""
        for command in super().get_system_commands(screen):
            if command.title == "Quit":
                yield SystemCommand(f"Quit ({QUIT_KEY})", "Quit ds4tui (asks first where a save failed)",
                                    command.callback)
            elif command.title == "Screenshot":
                yield SystemCommand("Screenshot", "Save an SVG picture of the screen into the --save-dir folder",
                                    lambda: self.set_timer(0.1, self.save_screen_picture))
            else:
                yield command
        for _, key, action, _, title, help_text, _ in ACTIONS:
            yield SystemCommand(f"{title} ({key})", help_text, partial(self.run_action, action))

    def save_screen_picture(self) -> Path | None:
        """The screen as an SVG file in ``--save-dir`` (``ds4tui-screen-STAMP.svg``), named in a toast;
        a failure names the file, why and what to do, as the other saves do.  The written path, or None."""
        path = Path(self.options.save_dir) / f"ds4tui-screen-{_stamp()}.svg"
        try:
            path.write_text(self.export_screenshot(), encoding="utf-8")
        except OSError as exc:
            self._error("cannot save the screenshot", f"{path}: {exc.strerror or exc}\n\nWhat to do: make the folder "
                        f"writable (or free space), or start the app with --save-dir naming a folder it can write")
            return None
        self.notify(f"screenshot saved: {path}", timeout=4)
        return path

    def on_unmount(self) -> None:
        if self.engine is not None:
            self.engine.stop()  # a thread worker cannot be killed: let it end at the next cycle
        if self._saved_switch is not None:  # quit during a turn: the interpreter's settings as they were
            self._turn_ended()
        if self._frozen:  # the process outlives the app (tests, benchmarks): its objects collectable again
            gc.unfreeze()
            self._frozen = False
        loop = asyncio.get_running_loop()
        for sig in getattr(self, "_signals", ()):
            loop.remove_signal_handler(sig)

    def unsaved_work(self, kinds: tuple[str, ...] = ("transcript", "stats")) -> list[str]:
        """What quitting now would lose: one line per save whose last attempt failed (Ctrl+S's
        transcript while the conversation has messages, F6's stats), naming the file; [] when
        nothing failed.  ``kinds``: the saves to look at, those the action discards
        (:func:`discarded_by`: a new chat loses only the transcript)."""
        lines = []
        if "transcript" in kinds and "transcript" in self.save_failed and self.messages:
            n = sum(m["role"] == "user" for m in self.messages)
            lines.append(f"the transcript ({plural(n, 'question')}): {key_of('chat.save')} could not write "
                         f"{self.save_failed['transcript']}")
        if "stats" in kinds and "stats" in self.save_failed:
            lines.append(f"the stats: {key_of('stats.export')} could not write {self.save_failed['stats']}")
        return lines

    @staticmethod
    def _unsaved_message(when: str, unsaved: list[str]) -> str:
        """The question's text before ``unsaved`` (:meth:`unsaved_work`) is lost ``when`` ("if you
        quit now"): each line, then the keys that save again."""
        return ("Not saved, lost " + when + ":\n" + "\n".join(f"- {line}" for line in unsaved)
                + "\n\nStay, make the folder writable (or free space) and press "
                + " / ".join(key_of(a) for kind, a in (("transcript", "chat.save"), ("stats", "stats.export"))
                             if any(line.startswith(f"the {kind}") for line in unsaved))
                + " again.")

    async def action_quit(self) -> None:
        """Quit (:meth:`quit_now`); when a save failed and its content was never saved
        (:meth:`unsaved_work`), a dialog asks first: quit anyway (Ctrl+Q again) or stay (Esc).  A
        signal (SIGTERM) quits without asking."""
        unsaved = self.unsaved_work(discarded_by("app.quit")) if not self._signal_rc else []
        if unsaved:
            if isinstance(self.screen, ConfirmQuit):  # Ctrl+Q again: quit anyway
                self.screen.dismiss(True)
                return
            if isinstance(self.screen, Confirm):  # Ctrl+Q while a new chat or a new context size is asked
                self.screen.dismiss(False)       # about: that is not done; quitting asks its own question
            self.push_screen(ConfirmQuit("Quit without saving?", self._unsaved_message("if you quit now", unsaved)),
                             lambda quit: self.call_later(self.quit_now) if quit else None)
            return
        await self.quit_now()

    async def quit_now(self) -> None:
        """Stop a running answer (thread workers cannot be cancelled: the engine stops at its next
        cycle), wait for the engine thread, then exit; status 1 after a failed load."""
        if self.engine is not None:
            self.engine.stop()
        for w in list(self.workers):
            if w.group in ("generation", "load") and not w.is_finished:
                try:
                    await w.wait()
                except (WorkerCancelled, WorkerFailed):
                    pass
        if self.telemetry is not None:
            self.telemetry.close()
        # the caller closes the engine once the terminal is restored (close() may print)
        if self._signal_rc:
            self.exit(return_code=self._signal_rc)
        elif self.load_error:
            self.exit(return_code=1, message=f"ds4tui chat: {self.load_error}")
        else:
            self.exit()

    def close_engine(self) -> str:
        """Free the engine (after the app has exited: with ``print_stats`` (DS4_DSPARK_STATS=1) this
        prints ds4's stats line to stderr).  Returns what closing could not do ('' when nothing):
        the scheduler prices file it could not write (``--scheduler-prices saved``)."""
        note = ""
        if self.engine is not None:
            note = self.engine.close() or ""
            self.engine = None
        return note


def _real_engine(options: ChatOptions, progress: Callable) -> W.ChatEngine:
    from ds4tui.engine.session import SamplingParams

    sampling = SamplingParams(temperature=options.temperature, top_k=options.top_k, top_p=options.top_p,
                              min_p=options.min_p, seed=options.seed)
    return W.ChatEngine(options.model, support=options.support, backend=options.backend, n_ctx=options.ctx,
                        numerics=options.numerics,
                        n_threads=options.threads, sampling=sampling, dspark=options.dspark, progress=progress,
                        gpu_layout=options.gpu_layout, gpu_library=options.gpu_library, scheduler=options.scheduler,
                        max_draft=options.max_draft, policy=options.policy, print_stats=options.print_stats,
                        prefill_gemm=options.prefill_gemm, activations=options.activations,
                        gpu_graphs=options.gpu_graphs, threshold=options.threshold,
                        scheduler_prices=options.scheduler_prices, prices_dir=options.prices_dir,
                        draft_vocab=options.draft_vocab, verify_head=options.verify_head, amx=options.amx)
