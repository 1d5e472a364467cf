"""Benchmark: what the chat app costs the engine ("UI tax", ux.md §0 item 5).

``python -m ds4tui.devtools.ui_tax MODEL [--mtp SUPPORT] [--tokens N] [--repeat R] [--out F.json]``

Two arms on one engine and one prompt, greedy, interleaved R times so machine drift hits both:

- ``headless``: the loop of ``ds4tui generate`` (prefill, then ``Session.step`` until N tokens,
  detokenizing each token), no UI;
- ``app``: the Textual app (``DS4App`` under Textual's headless driver, which lays out and renders
  every frame but writes no terminal) sends the same prompt, streams into the transcript and
  updates every pane at 10 Hz while the engine decodes in its worker thread.

Decode tokens/s = (tokens − 1) / (time from the first token to the last), as ``generate`` reports
it.  Prints the per-run numbers and the ratio app / headless (goal ≥ 0.98) and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

PROMPT = "Write a Python class for a doubly linked list with insert, delete and reverse methods."


def headless_run(chat, n_tokens: int) -> dict:
    """The generate loop on ``chat``'s session, from an empty KV cache."""
    from ds4tui.engine import session as S
    from ds4tui.engine.tokenizer import render_chat

    s, tok = chat.session, chat.tokenizer
    chat.new_chat()
    ids = render_chat(tok, [{"role": "user", "content": PROMPT}], think=False)
    s.prefill(ids)
    dec = tok.stream_decoder()
    out: list[int] = []
    t_first = None
    while len(out) < n_tokens:
        got = s.step(min(S.STEP_MAX, n_tokens - len(out)))
        if t_first is None:
            t_first = time.perf_counter()
        for t in got:
            out.append(t)
            dec.push(t)
    t_end = time.perf_counter()
    return {"tokens": len(out), "decode_s": t_end - t_first, "tokens_per_s": (len(out) - 1) / (t_end - t_first),
            "ids": out}


async def _app_run(chat, n_tokens: int) -> dict:
    from ds4tui.app import ChatOptions, DS4App

    chat.new_chat()
    opts = ChatOptions(model=chat.info.model_path, support=chat.info.support_path, think=False, max_tokens=n_tokens,
                       telemetry="rss")
    app = DS4App(opts, engine_factory=lambda options, progress: chat)
    async with app.run_test(size=(160, 50)) as pilot:
        while app.engine is None:
            await pilot.pause(0.05)
        app.query_one("#prompt").value = PROMPT
        await pilot.press("enter")
        while not app.turns:
            await asyncio.sleep(0.25)  # poll rarely: the harness should not add to what is measured
        r = app.turns[-1]
        app.engine = None  # the engine outlives the app: the next arm uses it
    return {"tokens": len(r.ids), "decode_s": r.decode_s, "tokens_per_s": r.decode_tokens_per_s, "ids": list(r.ids)}


def app_run(chat, n_tokens: int) -> dict:
    return asyncio.run(_app_run(chat, n_tokens))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ds4tui.devtools.ui_tax", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="DS4 GGUF")
    p.add_argument("--mtp", metavar="SUPPORT", help="DSpark support GGUF (DSpark on, scheduler on)")
    p.add_argument("--tokens", type=int, default=256, help="greedy tokens per run (default 256)")
    p.add_argument("--repeat", type=int, default=3, help="runs per arm, interleaved (default 3)")
    p.add_argument("--threads", type=int, default=0, help="engine threads (default 0 = one per core)")
    p.add_argument("--out", metavar="FILE.json", help="write the JSON result here")
    args = p.parse_args(argv)
    from ds4tui.engine.worker import ChatEngine

    chat = ChatEngine(args.model, support=args.mtp, backend="cpu", n_ctx=1024 + args.tokens, n_threads=args.threads)
    runs: dict[str, list[dict]] = {"headless": [], "app": []}
    try:
        for k in range(args.repeat):
            for arm, fn in (("headless", headless_run), ("app", app_run)):
                r = fn(chat, args.tokens)
                runs[arm].append(r)
                print(f"run {k + 1}/{args.repeat} {arm:<8} {r['tokens']} tokens  {r['tokens_per_s']:8.2f} tok/s",
                      file=sys.stderr, flush=True)
    finally:
        chat.close()
    med = {arm: statistics.median(r["tokens_per_s"] for r in rs) for arm, rs in runs.items()}
    same = all(r["ids"] == runs["headless"][0]["ids"] for rs in runs.values() for r in rs)
    result = {
        "model": args.model, "support": args.mtp, "tokens": args.tokens, "repeat": args.repeat,
        "headless_tokens_per_s": med["headless"], "app_tokens_per_s": med["app"],
        "ratio_app_over_headless": med["app"] / med["headless"], "outputs_identical": same,
        "runs": {arm: [{k: v for k, v in r.items() if k != "ids"} for r in rs] for arm, rs in runs.items()},
    }
    print(f"headless {med['headless']:.2f} tok/s · app {med['app']:.2f} tok/s · app/headless "
          f"{result['ratio_app_over_headless']:.3f} (median of {args.repeat}; outputs identical: {same})")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
