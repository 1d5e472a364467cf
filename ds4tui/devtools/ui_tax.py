"""Benchmark: what the chat app costs the engine ("UI tax", ux.md §0 item 5).

``python -m ds4tui.devtools.ui_tax MODEL [--mtp SUPPORT] [--backend cpu|hip|auto] [--tokens N]
[--repeat R] [--threads T] [--key-every S] [--out F.json]``

Two arms on one engine and one prompt, greedy, interleaved R times so machine drift hits both:

- ``headless``: the loop of ``ds4tui generate`` (prefill, then ``DecodeLoop`` until N tokens,
  detokenizing each token), no UI;
- ``app``: the Textual app (``DS4App`` under Textual's headless driver, which lays out and renders
  every frame but writes no terminal) sends the same prompt, streams into the transcript and
  updates every pane while the engine decodes in its worker thread.  Every ``--key-every``
  seconds while the answer streams, a key is typed into the prompt (as a person typing the next
  question would) and the time until the prompt shows it is recorded.

Decode tokens/s = (tokens − 1) / (time from the first token to the last), as ``generate`` reports
it.  Per run it also records the engine's own time inside its C steps (``engine_c_s``, from the
session's ``decode_ms``): a slower app run whose C time grew lost cores to the interface, one
whose C time did not lost time outside the C steps (waiting for the interpreter).  For the app
arm: the interface's CPU share while the answer streamed, the text writes per second and the
longest gap between two (as the app measures them, ``DS4App.turn_costs``: from its first text
write to the turn's end arriving), the UI thread's CPU seconds per second of decoding as this
benchmark measures them around the engine (``ui_cpu_decode_share``: from the engine's first token
to the end of its turn, read from the UI thread's CPU clock by the engine thread; the same for any
version of the app), and the key latencies.
Prints the per-run numbers and the ratio app / headless (goals: ≥ 0.95 on a CPU engine, ≥ 0.98
on a GPU) and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from pathlib import Path

#: Seconds between the model being ready and the prompt being sent (the app's start-up animations end).
SETTLE_S = 0.5
PROMPT = "Write a Python class for a doubly linked list with insert, delete and reverse methods."


def headless_run(chat, n_tokens: int) -> dict:
    """The generate loop (:class:`~ds4tui.engine.decode.DecodeLoop`, as ``ds4tui generate`` runs
    it) on ``chat``'s session, from an empty KV cache, detokenizing each token."""
    from ds4tui.engine.decode import DecodeLoop
    from ds4tui.engine.tokenizer import render_chat

    s, tok = chat.session, chat.tokenizer
    chat.new_chat()
    ids = render_chat(tok, [{"role": "user", "content": PROMPT}], think=False)
    s.prefill(ids)
    dec = tok.stream_decoder()
    t_first = None
    c0 = s.stats().decode_ms
    loop = DecodeLoop(s, n_tokens)
    for cycle in loop:
        if t_first is None:
            t_first = time.perf_counter()
        for t in cycle.tokens:
            dec.push(t)
    t_end = time.perf_counter()
    out = loop.ids
    return {"tokens": len(out), "decode_s": t_end - t_first, "tokens_per_s": (len(out) - 1) / (t_end - t_first),
            "engine_c_s": (s.stats().decode_ms - c0) / 1000, "ids": out}


async def _probe_keys(app, every: float, latencies: list[float]) -> None:
    """While the answer streams: every ``every`` seconds a key typed into the prompt, and the
    seconds until the prompt holds it."""
    from textual import events

    prompt = app.query_one("#prompt")
    wait = 0.05  # until the answer streams, then every ``every`` seconds
    while not app.turns:
        await asyncio.sleep(wait)
        msg = app.current
        if msg is None or not msg.n_tokens or app.turns:
            continue
        if wait < every:
            wait = every
            await asyncio.sleep(0.2)
        n = len(prompt.value)
        t0 = time.perf_counter()
        app.post_message(events.Key("x", "x"))
        while len(prompt.value) == n and not app.turns:
            await asyncio.sleep(0.002)
        if len(prompt.value) != n:
            latencies.append(time.perf_counter() - t0)


class _DecodeWindow:
    """Wraps ``chat.run_turn`` so that the engine thread reads the UI thread's CPU clock (and the
    time) when the turn's first token is handed over and when the turn ends.  ``cpu_share()``: the
    UI thread's CPU seconds per second between the two."""

    def __init__(self, chat, ui_thread_id: int):
        self.chat, self.clock = chat, time.pthread_getcpuclockid(ui_thread_id)
        self.first: tuple[float, float] | None = None
        self.end: tuple[float, float] | None = None

    def _mark(self) -> tuple[float, float]:
        return time.perf_counter(), time.clock_gettime(self.clock)

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


async def _app_run(chat, n_tokens: int, key_every: float) -> dict:
    from ds4tui.app import ChatOptions, DS4App

    chat.new_chat()
    opts = ChatOptions(model=chat.info.model_path, support=chat.info.support_path, think=False, max_tokens=n_tokens,
                       telemetry="rss")
    app = DS4App(opts, engine_factory=lambda options, progress: chat)
    keys: list[float] = []
    window = _DecodeWindow(chat, threading.get_ident())  # (the app's UI runs in this thread)
    with window:
        async with app.run_test(size=(160, 50)) as pilot:
            while app.engine is None:
                await pilot.pause(0.05)
            await pilot.pause(SETTLE_S)  # as a person would: the app has drawn its first screen
            app.query_one("#prompt").value = PROMPT
            c0 = chat.session.stats().decode_ms
            probe = asyncio.create_task(_probe_keys(app, key_every, keys)) if key_every > 0 else None
            await pilot.press("enter")  # (returns once the app is idle again: often at the end of the turn)
            while not app.turns:
                await asyncio.sleep(0.25)  # poll rarely: the harness should not add to what is measured
            if probe is not None:
                await probe
            r = app.turns[-1]
            cost = app.turn_costs[-1] if getattr(app, "turn_costs", None) else None  # (an app before they were kept)
            c1 = chat.session.stats().decode_ms
            app.engine = None  # the engine outlives the app: the next arm uses it
    measured = cost is not None and cost.wall_s > 0
    return {"tokens": len(r.ids), "decode_s": r.decode_s, "tokens_per_s": r.decode_tokens_per_s,
            "engine_c_s": (c1 - c0) / 1000, "ui_cpu_share": cost.cpu_s / cost.wall_s if measured else None,
            "text_writes_per_s": cost.text_writes / cost.wall_s if measured else None,
            "ui_cpu_decode_share": window.cpu_share(),
            "max_text_gap_s": cost.max_text_gap_s if measured else None,
            "key_latency_ms": [1000 * k for k in keys], "ids": list(r.ids)}


def app_run(chat, n_tokens: int, key_every: float = 1.0) -> dict:
    """The app arm: the Textual app under the headless driver on ``chat``'s engine, one prompt of
    ``n_tokens`` greedy tokens, a key typed every ``key_every`` seconds while it streams; the same
    figures as :func:`headless_run` plus the interface's CPU share (as the app measures it, and
    ``ui_cpu_decode_share``: UI thread CPU seconds per second from the engine's first token to the
    end of its turn), its text writes per second and longest gap (seconds) and the key latencies
    (milliseconds)."""
    return asyncio.run(_app_run(chat, n_tokens, key_every))


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ds4tui.devtools.ui_tax", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="DS4 GGUF")
    p.add_argument("--mtp", metavar="SUPPORT", help="DSpark support GGUF (DSpark on, scheduler on)")
    p.add_argument("--backend", choices=("cpu", "hip", "auto"), default="cpu", help="engine backend (default cpu)")
    p.add_argument("--tokens", type=int, default=256, help="greedy tokens per run (default 256)")
    p.add_argument("--repeat", type=int, default=3, help="runs per arm, interleaved (default 3)")
    p.add_argument("--threads", type=int, default=0, help="engine threads (default 0 = one per core)")
    p.add_argument("--key-every", type=float, default=1.0, metavar="S",
                   help="seconds between two keys typed while the app streams (default 1; 0: none)")
    p.add_argument("--out", metavar="FILE.json", help="write the JSON result here")
    args = p.parse_args(argv)
    from ds4tui.engine.worker import ChatEngine

    chat = ChatEngine(args.model, support=args.mtp, backend=args.backend, n_ctx=1024 + args.tokens,
                      n_threads=args.threads)
    runs: dict[str, list[dict]] = {"headless": [], "app": []}
    try:
        for k in range(args.repeat):
            for arm in ("headless", "app"):
                r = headless_run(chat, args.tokens) if arm == "headless" else app_run(chat, args.tokens, args.key_every)
                runs[arm].append(r)
                extra = ""
                if arm == "app":
                    keys = r["key_latency_ms"]
                    if r["ui_cpu_decode_share"] is not None:
                        extra = f"  UI thread {100 * r['ui_cpu_decode_share']:.1f}% of a core while decoding;"
                    if r["ui_cpu_share"] is not None:
                        extra += (f"  interface {100 * r['ui_cpu_share']:.1f}% of a core, text "
                                 f"{r['text_writes_per_s']:.1f}/s (longest gap {r['max_text_gap_s']:.2f} s)")
                    extra += f", keys {statistics.median(keys):.0f} ms median, {max(keys):.0f} max" if keys else ""
                print(f"run {k + 1}/{args.repeat} {arm:<8} {r['tokens']} tokens  {r['tokens_per_s']:8.2f} tok/s  "
                      f"C {r['engine_c_s']:.3f} s of {r['decode_s']:.3f} s{extra}", file=sys.stderr, flush=True)
    finally:
        chat.close()
    med = {arm: statistics.median(r["tokens_per_s"] for r in rs) for arm, rs in runs.items()}
    ratios = [a["tokens_per_s"] / h["tokens_per_s"] for h, a in zip(runs["headless"], runs["app"])]
    same = all(r["ids"] == runs["headless"][0]["ids"] for rs in runs.values() for r in rs)
    keys = [k for r in runs["app"] for k in r["key_latency_ms"]]
    result = {
        "model": args.model, "support": args.mtp, "backend": chat.info.backend, "n_threads": chat.info.n_threads,
        "tokens": args.tokens, "repeat": args.repeat,
        "headless_tokens_per_s": med["headless"], "app_tokens_per_s": med["app"],
        "ratio_app_over_headless": med["app"] / med["headless"], "ratio_per_pair": ratios,
        "outputs_identical": same,
        "ui_cpu_share": _median(r["ui_cpu_share"] for r in runs["app"]),
        "ui_cpu_decode_share": _median(r["ui_cpu_decode_share"] for r in runs["app"]),
        "text_writes_per_s": _median(r["text_writes_per_s"] for r in runs["app"]),
        "max_text_gap_s": max((r["max_text_gap_s"] for r in runs["app"] if r["max_text_gap_s"] is not None),
                              default=None),
        "key_latency_ms": {"n": len(keys), "median": _median(keys), "max": max(keys) if keys else None},
        "runs": {arm: [{k: v for k, v in r.items() if k != "ids"} for r in rs] for arm, rs in runs.items()},
    }
    print(f"headless {med['headless']:.2f} tok/s · app {med['app']:.2f} tok/s · app/headless "
          f"{result['ratio_app_over_headless']:.3f} (median of {args.repeat}; pairs {min(ratios):.3f}..{max(ratios):.3f};"
          f" outputs identical: {same})")
    if result["ui_cpu_decode_share"] is not None:
        print(f"UI thread {100 * result['ui_cpu_decode_share']:.1f}% of a core from the first token to the end "
              "(median)")
    if result["ui_cpu_share"] is not None:
        print(f"interface {100 * result['ui_cpu_share']:.1f}% of a core while streaming · text "
              f"{result['text_writes_per_s']:.1f}/s, longest gap {result['max_text_gap_s']:.2f} s")
    if keys:
        print(f"keys typed while streaming: {len(keys)}, shown after {result['key_latency_ms']['median']:.0f} ms "
              f"median, {result['key_latency_ms']['max']:.0f} ms max")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
