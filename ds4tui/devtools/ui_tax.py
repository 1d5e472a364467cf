"""Benchmark: what the chat app costs the engine ("UI tax", ux.md §0 item 5).

``python -m ds4tui.devtools.ui_tax MODEL [--mtp SUPPORT] [--backend cpu|hip|auto] [--tokens N]
[--repeat R] [--threads T] [--prompt TEXT] [--key-every S] [--terminal-output] [--out F.json]``

Two arms on one engine and one prompt, greedy, interleaved R times so machine drift hits both:

- ``headless``: the loop of ``ds4tui generate`` (prefill, then ``DecodeLoop`` until N tokens or
  the end of the answer, detokenizing each token), no UI;
- ``app``: the Textual app (``DS4App`` under Textual's headless driver, which lays out and renders
  every frame but writes no terminal) sends the same prompt, streams into the transcript and
  updates every pane while the engine decodes in its worker thread.  Every ``--key-every``
  seconds while the answer streams, a key is typed into the prompt (as a person typing the next
  question would: the event the terminal driver would post) and the time until the app has
  acted on it (the prompt holds it) and until the frame that shows it is recorded.  The prompt is
  sent with an Enter key as a terminal's driver sends it, and the benchmark sleeps until the turn
  ends (a pilot's key press would poll the process until idle, waking the UI thread every few
  milliseconds for the whole turn).  Every frame
  the app draws is timed, and the frames that show more of the answer than the frame before
  give the text's update rate on screen.  ``--terminal-output``: each frame is also turned into
  the terminal's escape sequences, as on a real terminal (the headless driver skips that work).

Both arms stop at the model's end of answer, as the chat does, so they always decode the same
tokens; an answer that ends before N tokens is reported (a short answer measures mostly the turn's
start: ``--prompt`` picks one that runs longer).

Decode tokens/s = (tokens − 1) / (time from the first token to the last), as ``generate`` reports
it.  Per run it also records the engine's own time inside its C steps (``engine_c_s``, from the
session's ``decode_ms``): a slower app run whose C time grew lost cores to the interface, one
whose C time did not lost time outside the C steps (waiting for the interpreter).  For the app
arm: the interface's CPU share while the answer streamed, the text writes per second and the
longest gap between two (as the app measures them, ``DS4App.turn_costs``: from its first text
write to the turn's end arriving), the UI thread's CPU seconds per second of decoding as this
benchmark measures them around the engine (``ui_cpu_decode_share``: from the engine's first token
to the end of its turn, read from the UI thread's CPU clock by the engine thread; the same for any
version of the app), in the same window the UI thread's wake-ups per second (``ui_wakeups_per_s``:
its voluntary context switches; on a CPU engine each wake-up takes a core from an engine thread,
whose partner then waits for it at the end of the pool's run) and, for both arms, how often the
other threads — the engine's — were preempted (``engine_preempted_per_s``: involuntary context
switches; Linux's ``/proc/self/task``, None elsewhere), the key latencies (``key_latency_ms``: until the prompt holds the key;
``key_to_frame_ms``: until the frame that shows it), and the answer's frames
(``text_frames_per_s``: frames that show more of the answer, per second from the first to the
last; ``max_text_frame_gap_s``: the longest time between two).
Prints the per-run numbers and the ratio app / headless (goals: ≥ 0.95 on a CPU engine, ≥ 0.98
on a GPU; keys acted on within 100 ms, text shown at least 5 times a second) and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import os
import time
from pathlib import Path
from typing import Awaitable, Callable

#: Seconds between the model being ready and the prompt being sent (the app's start-up animations end).
SETTLE_S = 0.5
#: The default prompt: the bundled demo pair answers it with 1024 tokens and more (greedy, no thinking).
PROMPT = "Write a Python class for a binary search tree with insert, delete, search, and in-order traversal methods."


def thread_switches(exclude: int | None = None) -> tuple[int, int] | None:
    """(voluntary, involuntary) context switches of this process's threads so far, summed over
    all but the thread whose native id is ``exclude``; of that thread alone when ``exclude`` is
    negative (``-tid``).  A voluntary switch is a thread going to sleep (each sleep ends in a
    wake-up), an involuntary one a thread preempted while it could run.  None where
    ``/proc/self/task`` is missing (not Linux)."""
    try:
        tids = [-exclude] if exclude is not None and exclude < 0 else os.listdir("/proc/self/task")
    except OSError:
        return None
    vol = invol = 0
    for tid in tids:
        if exclude is not None and exclude > 0 and int(tid) == exclude:
            continue
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        vol += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        invol += int(line.split()[1])
        except OSError:  # (a thread that ended since the listing)
            if exclude is not None and exclude < 0:
                return None
    return vol, invol


def _per_s(a: tuple[int, int] | None, b: tuple[int, int] | None, seconds: float, i: int) -> float | None:
    return (b[i] - a[i]) / seconds if a is not None and b is not None and seconds > 0 else None


def headless_run(chat, n_tokens: int, prompt: str = PROMPT) -> dict:
    """The generate loop (:class:`~ds4tui.engine.decode.DecodeLoop`, as ``ds4tui generate`` runs
    it) on ``chat``'s session, from an empty KV cache, detokenizing each token, until ``n_tokens``
    or the end of the answer (as the chat stops)."""
    from ds4tui.engine.decode import DecodeLoop
    from ds4tui.engine.tokenizer import render_chat

    s, tok = chat.session, chat.tokenizer
    chat.new_chat()
    ids = render_chat(tok, [{"role": "user", "content": prompt}], think=False)
    s.prefill(ids)
    dec = tok.stream_decoder()
    t_first = None
    c0 = s.stats().decode_ms
    loop = DecodeLoop(s, n_tokens, stop=(tok.eos_id,))
    for cycle in loop:
        if t_first is None:
            t_first, sw0 = time.perf_counter(), thread_switches()
        for t in cycle.tokens:
            dec.push(t)
    t_end, sw1 = time.perf_counter(), thread_switches()
    out = loop.ids
    return {"tokens": len(out), "decode_s": t_end - t_first, "tokens_per_s": (len(out) - 1) / (t_end - t_first),
            "engine_c_s": (s.stats().decode_ms - c0) / 1000,
            "engine_preempted_per_s": _per_s(sw0, sw1, t_end - t_first, 1), "ids": out}


class _Frames:
    """Wraps the app's ``_display`` (called with each frame the screen's compositor made): the time
    of every frame and the answer's tokens it shows (``app.current.n_tokens``: the streaming
    message's); and a key typed into the prompt is timed until the app acts on it and until the
    frame after that."""

    def __init__(self, app, terminal_output: bool = False):
        self.app, self.terminal_output = app, terminal_output
        self.frames: list[tuple[float, int]] = []  # (perf_counter, tokens shown)
        self.key: tuple[float, int] | None = None  # (when posted, the prompt's length before)
        self.acted: float | None = None  # when the prompt was seen holding the key
        self.shown = asyncio.Event()
        self.key_ms: list[float] = []  # until the prompt holds the key
        self.key_frame_ms: list[float] = []  # until the frame after that
        display = app._display

        def timed(screen, renderable) -> None:
            display(screen, renderable)
            if renderable is None:
                return
            if self.terminal_output and hasattr(renderable, "render_segments"):
                renderable.render_segments(app.console)  # what a terminal driver would write
            t = time.perf_counter()
            msg = app.current
            self.frames.append((t, msg.n_tokens if msg is not None else -1))
            if self.key is not None and self.acted is not None:
                self.key_frame_ms.append(1000 * (t - self.key[0]))
                self.key, self.acted = None, None
                self.shown.set()

        app._display = timed  # (an instance attribute)
        self.prompt = app.query_one("#prompt")
        app.watch(self.prompt, "value", self._typed, init=False)

    def _typed(self, value: str) -> None:
        if self.key is not None and self.acted is None and len(value) != self.key[1]:
            self.acted = time.perf_counter()
            self.key_ms.append(1000 * (self.acted - self.key[0]))

    async def type_key(self, timeout: float = 2.0) -> None:
        """Post a key for the prompt and wait (at most ``timeout`` s) until a frame shows it."""
        from textual import events

        self.shown.clear()
        self.key, self.acted = (time.perf_counter(), len(self.prompt.value)), None
        self.app.post_message(events.Key("x", "x"))
        try:
            await asyncio.wait_for(self.shown.wait(), timeout)
        except asyncio.TimeoutError:
            self.key = None  # (not acted on, or not drawn, in ``timeout``: left out)

    def text_rate(self) -> tuple[float | None, float | None, int]:
        """(frames that show more of the answer per second, from the first to the last; the longest
        time between two, seconds; their number)."""
        times, last = [], 0
        for t, n in self.frames:
            if n > last:
                times.append(t)
                last = n
            elif n < 0:
                last = 0
        if len(times) < 2:
            return None, None, len(times)
        gaps = [b - a for a, b in zip(times, times[1:])]
        return (len(times) - 1) / (times[-1] - times[0]), max(gaps), len(times)


async def _probe_keys(app, every: float, frames: _Frames) -> None:
    """While the answer streams: every ``every`` seconds a key typed into the prompt (the first
    0.2 s after the first text), timed by ``frames``."""
    wait = 0.05  # until the answer streams, then every ``every`` seconds
    while not app.turns:
        await asyncio.sleep(wait)
        msg = app.current
        if msg is None or not msg.n_tokens or app.turns:
            continue
        if wait < every:
            wait = every
            await asyncio.sleep(0.2)
            if app.turns:
                break
        await frames.type_key()


class _DecodeWindow:
    """Wraps ``chat.run_turn`` so that the engine thread reads the UI thread's CPU clock (and the
    time) when the turn's first token is handed over and when the turn ends.  ``cpu_share()``: the
    UI thread's CPU seconds per second between the two."""

    def __init__(self, chat, ui_thread_id: int, ui_native_id: int | None = None):
        self.chat, self.clock = chat, time.pthread_getcpuclockid(ui_thread_id)
        self.ui_native_id = ui_native_id
        self.first: tuple | None = None
        self.end: tuple | None = None

    def _mark(self) -> tuple:
        """(time, the UI thread's CPU time, its context switches, the other threads')."""
        tid = self.ui_native_id
        return (time.perf_counter(), time.clock_gettime(self.clock),
                thread_switches(-tid) if tid else None, thread_switches(tid) if tid else None)

    def __enter__(self) -> "_DecodeWindow":
        from ds4tui.engine.worker import TokensEmitted

        run_turn, window = self.chat.run_turn, self

        class Sink:
            def __init__(self, sink):
                self.sink = sink

            def put(self, ev) -> None:
                if window.first is None and isinstance(ev, TokensEmitted):
                    window.first = window._mark()
                self.sink.put(ev)

        def timed(messages, sink, **kw):
            try:
                return run_turn(messages, Sink(sink), **kw)
            finally:
                window.end = window._mark()

        self.chat.run_turn = timed  # (an instance attribute: removed on exit)
        return self

    def __exit__(self, *exc) -> None:
        del self.chat.run_turn

    def cpu_share(self) -> float | None:
        if self.first is None or self.end is None or self.end[0] <= self.first[0]:
            return None
        return (self.end[1] - self.first[1]) / (self.end[0] - self.first[0])

    def switches_per_s(self) -> tuple[float | None, float | None]:
        """(the UI thread's wake-ups per second, the other threads' — the engine's — preemptions
        per second) between the two marks (None where not measured)."""
        if self.first is None or self.end is None:
            return None, None
        dt = self.end[0] - self.first[0]
        return _per_s(self.first[2], self.end[2], dt, 0), _per_s(self.first[3], self.end[3], dt, 1)


def _turn_end(app) -> Callable[[], Awaitable[None]]:
    """A coroutine function that returns once ``app`` has finished a turn: it waits on the app's
    ``_finished`` (wrapped: no polling while the turn runs); for an app without one, it polls
    ``app.turns`` every 0.25 s."""
    done = asyncio.Event()
    finished = getattr(app, "_finished", None)
    if finished is None:
        async def polled() -> None:
            while not app.turns:
                await asyncio.sleep(0.25)
        return polled

    async def wrapped(*args, **kw):
        try:
            return await finished(*args, **kw)
        finally:
            done.set()

    app._finished = wrapped  # (an instance attribute)

    async def wait() -> None:
        await done.wait()
    return wait


async def _app_run(chat, n_tokens: int, key_every: float, terminal_output: bool, prompt: str) -> dict:
    from textual import events

    from ds4tui.app import ChatOptions, DS4App

    chat.new_chat()
    opts = ChatOptions(model=chat.info.model_path, support=chat.info.support_path, think=False, max_tokens=n_tokens,
                       telemetry="rss")
    app = DS4App(opts, engine_factory=lambda options, progress: chat)
    window = _DecodeWindow(chat, threading.get_ident(), threading.get_native_id())  # (the app's UI runs here)
    with window:
        async with app.run_test(size=(160, 50)) as pilot:
            frames = _Frames(app, terminal_output)
            while app.engine is None:
                await pilot.pause(0.05)
            await pilot.pause(SETTLE_S)  # as a person would: the app has drawn its first screen
            app.query_one("#prompt").value = prompt
            c0 = chat.session.stats().decode_ms
            ended = _turn_end(app)
            probe = asyncio.create_task(_probe_keys(app, key_every, frames)) if key_every > 0 else None
            # Enter as the terminal's driver sends it; the harness then sleeps until the turn ends (a
            # pilot's key press polls the process until it is idle: a wake-up of the UI thread every
            # few milliseconds, which no terminal adds)
            enter = events.Key("enter", "\r")
            enter.set_sender(app)
            app._driver.send_message(enter)
            await ended()
            if probe is not None:
                await probe
            r = app.turns[-1]
            cost = app.turn_costs[-1] if getattr(app, "turn_costs", None) else None  # (an app before they were kept)
            c1 = chat.session.stats().decode_ms
            app.engine = None  # the engine outlives the app: the next arm uses it
    measured = cost is not None and cost.wall_s > 0
    rate, gap, n_frames = frames.text_rate()
    wakeups, preempted = window.switches_per_s()
    return {"tokens": len(r.ids), "decode_s": r.decode_s, "tokens_per_s": r.decode_tokens_per_s,
            "engine_c_s": (c1 - c0) / 1000, "ui_cpu_share": cost.cpu_s / cost.wall_s if measured else None,
            "text_writes_per_s": cost.text_writes / cost.wall_s if measured else None,
            "ui_cpu_decode_share": window.cpu_share(), "ui_wakeups_per_s": wakeups,
            "engine_preempted_per_s": preempted,
            "max_text_gap_s": cost.max_text_gap_s if measured else None,
            "text_frames": n_frames, "text_frames_per_s": rate, "max_text_frame_gap_s": gap,
            "frames": len(frames.frames),
            "key_latency_ms": frames.key_ms, "key_to_frame_ms": frames.key_frame_ms, "ids": list(r.ids)}


def app_run(chat, n_tokens: int, key_every: float = 1.0, terminal_output: bool = False, prompt: str = PROMPT) -> dict:
    """The app arm: the Textual app under the headless driver on ``chat``'s engine, one prompt of
    ``n_tokens`` greedy tokens, a key typed every ``key_every`` seconds while it streams; the same
    figures as :func:`headless_run` plus the interface's CPU share (as the app measures it, and
    ``ui_cpu_decode_share``: UI thread CPU seconds per second from the engine's first token to the
    end of its turn), its text writes per second and longest gap (seconds), the frames that show
    more of the answer (per second, longest gap in seconds), and the key latencies (milliseconds:
    until the app acted, until the frame that shows it).  ``terminal_output``: each frame is also
    turned into the terminal's escape sequences, as a terminal driver would."""
    return asyncio.run(_app_run(chat, n_tokens, key_every, terminal_output, prompt))


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    from ds4tui.cli import positive_int, thread_count

    p = argparse.ArgumentParser(prog="python -m ds4tui.devtools.ui_tax", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="DS4 GGUF")
    p.add_argument("--mtp", metavar="SUPPORT", help="DSpark support GGUF (DSpark on, scheduler on)")
    p.add_argument("--backend", choices=("cpu", "hip", "auto"), default="cpu", help="engine backend (default cpu)")
    p.add_argument("--tokens", type=positive_int, default=256, help="greedy tokens per run (default 256)")
    p.add_argument("--repeat", type=positive_int, default=3, help="runs per arm, interleaved (default 3)")
    p.add_argument("--threads", type=thread_count, default=0, help="engine threads (default 0 = one per core)")
    def question(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError("expected a question, found an empty or blank text")
        return text

    p.add_argument("--prompt", type=question, default=PROMPT, metavar="TEXT",
                   help="the question both arms answer (default: one the demo pair answers at length)")
    p.add_argument("--key-every", type=float, default=1.0, metavar="S",
                   help="seconds between two keys typed while the app streams (default 1; 0: none)")
    p.add_argument("--terminal-output", action="store_true",
                   help="turn each frame into the terminal's escape sequences too, as on a real terminal "
                        "(the headless driver skips that work)")
    p.add_argument("--out", metavar="FILE.json", help="write the JSON result here")
    args = p.parse_args(argv)
    from ds4tui.engine.errors import EngineError, ModelFileError, TokenizerError
    from ds4tui.engine.worker import ChatEngine

    try:
        chat = ChatEngine(args.model, support=args.mtp, backend=args.backend, n_ctx=1024 + args.tokens,
                          n_threads=args.threads)
    except (ModelFileError, EngineError, TokenizerError, OSError) as exc:  # one line, as the ds4tui commands
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 1
    runs: dict[str, list[dict]] = {"headless": [], "app": []}
    try:
        for k in range(args.repeat):
            for arm in ("headless", "app"):
                r = (headless_run(chat, args.tokens, args.prompt) if arm == "headless"
                     else app_run(chat, args.tokens, args.key_every, args.terminal_output, args.prompt))
                runs[arm].append(r)
                extra = ""
                if r["engine_preempted_per_s"] is not None:
                    extra = f"  engine preempted {r['engine_preempted_per_s']:.0f}/s;"
                if arm == "app":
                    keys = r["key_latency_ms"]
                    if r["ui_cpu_decode_share"] is not None:
                        extra += f"  UI thread {100 * r['ui_cpu_decode_share']:.1f}% of a core while decoding"
                        extra += (f", {r['ui_wakeups_per_s']:.0f} wake-ups/s;" if r["ui_wakeups_per_s"] is not None
                                  else ";")
                    if r["ui_cpu_share"] is not None:
                        extra += (f"  interface {100 * r['ui_cpu_share']:.1f}% of a core, text "
                                 f"{r['text_writes_per_s']:.1f}/s (longest gap {r['max_text_gap_s']:.2f} s)")
                    if r["text_frames_per_s"] is not None:
                        extra += (f", text frames {r['text_frames_per_s']:.1f}/s (longest gap "
                                  f"{r['max_text_frame_gap_s']:.2f} s)")
                    shown = r["key_to_frame_ms"]
                    extra += f", keys {statistics.median(keys):.1f} ms median, {max(keys):.1f} max" if keys else ""
                    extra += f" (on screen {statistics.median(shown):.1f}, {max(shown):.1f} max)" if shown else ""
                print(f"run {k + 1}/{args.repeat} {arm:<8} {r['tokens']} tokens  {r['tokens_per_s']:8.2f} tok/s  "
                      f"C {r['engine_c_s']:.3f} s of {r['decode_s']:.3f} s{extra}", file=sys.stderr, flush=True)
    finally:
        chat.close()
    med = {arm: statistics.median(r["tokens_per_s"] for r in rs) for arm, rs in runs.items()}
    ratios = [a["tokens_per_s"] / h["tokens_per_s"] for h, a in zip(runs["headless"], runs["app"])]
    same = all(r["ids"] == runs["headless"][0]["ids"] for rs in runs.values() for r in rs)
    keys = [k for r in runs["app"] for k in r["key_latency_ms"]]
    shown = [k for r in runs["app"] for k in r["key_to_frame_ms"]]
    result = {
        "model": args.model, "support": args.mtp, "backend": chat.info.backend, "n_threads": chat.info.n_threads,
        "tokens": args.tokens, "prompt": args.prompt, "answer_tokens": len(runs["headless"][0]["ids"]),
        "repeat": args.repeat, "terminal_output": args.terminal_output,
        "headless_tokens_per_s": med["headless"], "app_tokens_per_s": med["app"],
        "ratio_app_over_headless": med["app"] / med["headless"], "ratio_per_pair": ratios,
        "outputs_identical": same,
        "ui_cpu_share": _median(r["ui_cpu_share"] for r in runs["app"]),
        "ui_cpu_decode_share": _median(r["ui_cpu_decode_share"] for r in runs["app"]),
        "ui_wakeups_per_s": _median(r["ui_wakeups_per_s"] for r in runs["app"]),
        "engine_preempted_per_s": {arm: _median(r["engine_preempted_per_s"] for r in rs) for arm, rs in runs.items()},
        "text_writes_per_s": _median(r["text_writes_per_s"] for r in runs["app"]),
        "max_text_gap_s": max((r["max_text_gap_s"] for r in runs["app"] if r["max_text_gap_s"] is not None),
                              default=None),
        "text_frames_per_s": _median(r["text_frames_per_s"] for r in runs["app"]),
        "min_text_frames_per_s": min((r["text_frames_per_s"] for r in runs["app"] if r["text_frames_per_s"] is not None),
                                     default=None),
        "max_text_frame_gap_s": max((r["max_text_frame_gap_s"] for r in runs["app"]
                                     if r["max_text_frame_gap_s"] is not None), default=None),
        "key_latency_ms": {"n": len(keys), "median": _median(keys), "max": max(keys) if keys else None},
        "key_to_frame_ms": {"n": len(shown), "median": _median(shown), "max": max(shown) if shown else None},
        "runs": {arm: [{k: v for k, v in r.items() if k != "ids"} for r in rs] for arm, rs in runs.items()},
    }
    print(f"headless {med['headless']:.2f} tok/s · app {med['app']:.2f} tok/s · app/headless "
          f"{result['ratio_app_over_headless']:.3f} (median of {args.repeat}; pairs {min(ratios):.3f}..{max(ratios):.3f};"
          f" outputs identical: {same})")
    if result["answer_tokens"] < args.tokens:
        print(f"note: the answer ended after {result['answer_tokens']} of {args.tokens} tokens: a short answer measures "
              "mostly the turn's start (--prompt picks one that runs longer)")
    if result["ui_cpu_decode_share"] is not None:
        print(f"UI thread {100 * result['ui_cpu_decode_share']:.1f}% of a core from the first token to the end "
              "(median)" + (f", woken {result['ui_wakeups_per_s']:.0f} times a second"
                            if result["ui_wakeups_per_s"] is not None else ""))
    pre = result["engine_preempted_per_s"]
    if pre["headless"] is not None and pre["app"] is not None:
        print(f"engine threads preempted {pre['headless']:.0f}/s headless, {pre['app']:.0f}/s in the app (medians)")
    if result["ui_cpu_share"] is not None:
        print(f"interface {100 * result['ui_cpu_share']:.1f}% of a core while streaming · text "
              f"{result['text_writes_per_s']:.1f}/s, longest gap {result['max_text_gap_s']:.2f} s")
    if result["text_frames_per_s"] is not None:
        print(f"answer on screen: {result['text_frames_per_s']:.1f} frames/s with more text (median of runs, lowest "
              f"{result['min_text_frames_per_s']:.1f}), longest gap {result['max_text_frame_gap_s']:.2f} s")
    if keys:
        print(f"keys typed while streaming: {len(keys)}, acted on after {result['key_latency_ms']['median']:.1f} ms "
              f"median, {result['key_latency_ms']['max']:.1f} ms max")
    if shown:
        print(f"keys on screen after {result['key_to_frame_ms']['median']:.1f} ms median, "
              f"{result['key_to_frame_ms']['max']:.1f} ms max ({len(shown)} keys)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
