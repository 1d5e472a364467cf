"""The DSpark scheduler on many texts without timing noise: record acceptance traces of the demo pair,
then replay the engine's scheduler on them (spec dspark.md §7.5).

``python tools/scheduler_replay.py record OUT.json [--tokens 512] [--threads 2] [--model MODEL --mtp
SUPPORT] [--amx auto|on|off]`` answers each prompt below greedily with the demo pair (or the pair given) and records, for
every anchor position, how many of the block's drafts the target accepts there (a drafted step, then a
rewind that keeps its first token, so every position is an anchor) and the drafter's confidence in each
draft (``confidence``, read by ``tools/confidence_study.py``); then, on the first prompt, the
costs the scheduler prices with: the engine's mean time of a plain decode (64 of them), of a proposal
and of a verify of each width 2 .. block + 1 (24 drafted cycles a width).  About 4 s a prompt on 2
threads.

``python tools/scheduler_replay.py replay TRACES.json [--tokens 255] [--after 0,1] [--json]`` replays
each trace through ``ds4_dspark_replay`` (the scheduler's own code, ``native/scheduler.c``) at the
recorded costs: DSpark with the scheduler off, then for each of the scheduler's policies (spec
dspark.md §7.4, §7.6: acceptance, and confidence where the file holds the recorded confidences) a fresh
session's scheduler and sessions that start from the engine's kept prices after one earlier session
(``--after``: the prompts whose session comes first, by index; default 0 and 1, the bench's code and
prose prompts), the kept prices carried with the engine's own merge (``SchedulerPrices.merged``, then
``capped``).  Prints each prompt's rate over
target-only decoding and per arm the minimum, the mean and how many prompts fall below 0.99 (issue:
the scheduler never a net loss).  Not a test: CI never runs it; ``tools/cpu_notes.md`` records what
it printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

# ds4tui is the one Python imports (the installed package, or this tree when installed with -e), as
# for the other tools; eval_demo comes from this folder, first on the path of a script run from it

from ds4tui.cli import drop_stdout
from ds4tui.commands.compare import json_type
from ds4tui.engine.backend import SCHEDULER_POLICIES
from ds4tui.engine.errors import EngineError, ModelFileError
from ds4tui.engine.prices import MAX_BLOCK, SchedulerPrices
from ds4tui.engine.replay import Costs, replay_scheduler, time_ms

PROSE_PROMPTS = (
    "Write a short story about a cat who learns to play the piano.",
    "Explain to a ten-year-old why the sky is blue.",
    "Write a letter to a friend describing a trip to the mountains.",
    "Summarise the causes of the French Revolution in a few paragraphs.",
    "Describe the life cycle of a butterfly.",
    "Write a product review of a pair of running shoes.",
    "What are the benefits and drawbacks of working from home?",
    "Write a poem about the sea at night.",
    "Give me three tips for getting better sleep.",
    "Write a haiku sequence about autumn leaves.",
    "Explain how a bicycle gear system works.",
    "Tell me about the history of the printing press.",
    "Write a cover letter for a job as a librarian.",
    "Describe a busy market in the morning.",
    "What should I pack for a week-long camping trip?",
    "Compare cats and dogs as pets.",
)
"""Requests for prose (written for this tool; the demo's drafter accepts little of its answers)."""

CODE_PROMPTS = (
    "Write a Python class for a stack with push, pop and peek, with tests.",
    "Write a function that parses a CSV line with quoted fields.",
    "Refactor this code to use a dictionary comprehension: result = {}\nfor k in keys:\n    result[k] = len(k)",
    "Write a binary search function in Python and explain it.",
    "Implement a linked list in Python with insert and delete.",
    "Write a Python script that counts word frequencies in a file.",
    "Write a function to check whether a string is a palindrome, ignoring punctuation.",
    "Write a Python decorator that retries a function three times on exception.",
)
"""Requests for code beyond ``tools/eval_demo.py``'s function requests."""


def prompts() -> list[tuple[str, str]]:
    """(kind, text): the bench's code and prose prompts first (indexes 0 and 1), then the function
    requests of ``tools/eval_demo.py``, then this tool's prose and code requests."""
    from ds4tui.commands.bench import AB_PROMPTS
    from eval_demo import FUNCTION_PROMPTS

    return ([(kind, text) for kind, text in AB_PROMPTS] + [("function", t) for t in FUNCTION_PROMPTS]
            + [("prose", t) for t in PROSE_PROMPTS] + [("code", t) for t in CODE_PROMPTS])


#: The traces' confidence threshold: the smallest positive float32, so that no draft is cut.
CONFIDENCE_THRESHOLD = 1.401298464324817e-45


def record(out: Path, n_tokens: int, threads: int, pair_files: tuple[Path, Path] | None = None,
           amx: str = "auto") -> int:
    """Record the traces and costs of ``pair_files`` (target GGUF, DSpark support GGUF), else of the
    bundled demo pair, to ``out``; 0, or 1 after a one-line error."""
    from ds4tui.engine.gguf_model import DS4Model
    from ds4tui.engine.session import Engine, SamplingParams
    from ds4tui.engine.tokenizer import Tokenizer, render_chat

    if pair_files is None:
        from ds4tui.demo import demo_pair

        pair = demo_pair()
        if pair is None:
            raise SystemExit("scheduler_replay: this build ships no demo pair")
        model_path, support_path = pair.model, pair.support
    else:
        model_path, support_path = pair_files
    for what, f in (("target model", model_path), ("support model", support_path)):
        if out.exists() and out.resolve() == Path(f).resolve():
            print(f"scheduler_replay: error: {out} is the pair's {what}: the recording would replace it; give "
                  f"another OUT", file=sys.stderr)
            return 1
    model = DS4Model(str(model_path))
    tok = Tokenizer.from_gguf(model.reader)
    try:
        eng = Engine(model, support=support_path, n_threads=threads, activations="auto", scheduler_prices="fresh",
                     amx=amx)
    except EngineError as exc:  # --amx on where the tiles cannot run: one line naming it
        print(f"scheduler_replay: error: {exc}", file=sys.stderr)
        return 1
    if eng.support_status != "attached":
        eng.close()
        print(f"scheduler_replay: error: --mtp {support_path}: the support model does not fit {model_path} "
              f"({eng.support_message or eng.support_status})", file=sys.stderr)
        return 1
    block = eng.block_size
    traces = []

    def session(ids, extra):
        s = eng.session(len(ids) + extra)
        s.set_sampling(SamplingParams())
        s.prefill(ids)
        return s

    t0 = time.perf_counter()
    cut = 0  # proposals shorter than the block: a confidence of exactly 0 (or no room) cut them
    for i, (kind, text) in enumerate(prompts()):
        ids = render_chat(tok, [{"role": "user", "content": text}], think=False)
        s = session(ids, n_tokens + 8)
        # the least positive threshold: the drafter computes every draft's confidence c_k (kept in
        # `confidence`, tools/confidence_study.py) and cuts only at a c_k of exactly 0 (counted below)
        s.set_dspark(enabled=True, scheduler=False, threshold=CONFIDENCE_THRESHOLD, max_draft=block)
        s.step()  # samples the prefill's logits
        accepted, confidence = [], []
        while len(accepted) < n_tokens:
            got = s.step(block + 1)
            drafts, conf = s.last_proposal()
            confidence.append([round(float(c), 6) for c in conf])
            cut += len(drafts) < block
            if len(got) > 1:
                s.rewind(len(got) - 1)  # keep the first token: the next position is an anchor too
            accepted.append(len(got) - 1)
        s.close()
        traces.append({"kind": kind, "text": text, "accepted": accepted, "confidence": confidence})
        print(f"[{i + 1}] {kind}: {sum(accepted) / len(accepted):.2f} drafts accepted a position "
              f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    if cut:
        print(f"scheduler_replay: note: {cut} proposals were shorter than the block of {block} (a draft's confidence "
              f"of exactly 0 cuts it even at the least threshold): their accepted counts stop there", file=sys.stderr)
    # the costs, on the first prompt: the engine's own pass times (what the scheduler prices with),
    # means over 64 plain decodes and over 24 drafted cycles of each verify width
    ids = render_chat(tok, [{"role": "user", "content": prompts()[0][1]}], think=False)
    s = session(ids, 64 + 24 * block + 8)
    s.set_dspark(enabled=False)
    for _ in range(64):
        s.step()
    st = s.dspark_stats()
    t_decode = st.target / st.cycles
    s.set_dspark(enabled=True, scheduler=False, threshold=0.0)
    widths, propose, drafted = {}, 0.0, 0
    for n in range(2, block + 2):
        s.set_dspark(max_draft=n - 1)
        before = s.dspark_stats()
        for _ in range(24):
            got = s.step(n)
            if len(got) > 1:
                s.rewind(len(got) - 1)
        after = s.dspark_stats()
        cycles = (after.cycles - after.no_draft) - (before.cycles - before.no_draft)
        widths[n] = (after.verify - before.verify) / cycles
        propose, drafted = propose + after.propose - before.propose, drafted + cycles
    s.close()
    eng.close()
    t_prop = propose / drafted
    data = {"model": str(model_path), "support": str(support_path), "threads": threads, "tokens": n_tokens,
            "activations": eng.activations, "amx": eng.amx, "block": block,
            "costs": {"t_decode": t_decode, "t_propose": t_prop,
                      "t_verify": {str(n): ms for n, ms in sorted(widths.items())}},
            "traces": traces}
    tmp = out.with_name(out.name + ".partial")
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, out)  # whole or not at all: a full disk leaves an earlier recording as it was
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        print(f"scheduler_replay: error: {out}: cannot be written ({exc.strerror}); nothing was changed there",
              file=sys.stderr)
        return 1
    c = data["costs"]
    print(f"scheduler_replay: {len(traces)} traces of {n_tokens} positions to {out}; decode {c['t_decode']:.3f} ms, "
          f"proposal {c['t_propose']:.3f} ms, verify "
          + ", ".join(f"{n} rows {ms:.3f}" for n, ms in c["t_verify"].items()), file=sys.stderr)
    return 0


#: Tokens a replay emits by default: bench --ab's timed steps.
DEFAULT_REPLAY_TOKENS = 255
#: The prompts whose fresh session comes first for the kept arms by default: the bench's code and prose.
DEFAULT_AFTER = (0, 1)


def quiet_broken_pipe() -> None:
    """Exit 141 (128 + SIGPIPE) without the traceback Python prints when stdout's reader has gone (``| head``),
    standard output dropped as the ds4tui program drops it (``ds4tui.cli.drop_stdout``)."""
    drop_stdout()
    raise SystemExit(141)


class TraceError(Exception):
    """A traces file that cannot be replayed; the message names the file, what was expected and what was found."""


def _cost(path: Path, name: str, v) -> float:
    """A time in ms from the file (a JSON number in replay.MIN_MS..MAX_MS), else TraceError naming it."""
    try:
        return time_ms(f"costs.{name}", v)
    except ValueError as exc:
        raise TraceError(f"{path}: {exc}") from None


def load_traces(path: Path) -> tuple[Costs, int, list[dict]]:
    """The costs, block size and traces of a file ``record`` wrote; raises TraceError."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file (write one with `python tools/scheduler_replay.py record {path}`)")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot be read: {exc}")
    except (json.JSONDecodeError, ValueError, RecursionError) as exc:  # ValueError: an integer past Python's digits
        raise TraceError(f"{path}: not JSON this tool reads ({type(exc).__name__}: {str(exc)[:80]}); expected what "
                         "`scheduler_replay.py record` writes")
    if not isinstance(data, dict):
        raise TraceError(f"{path}: expected a JSON object with costs, block and traces, found {json_type(data)}")
    missing = [k for k in ("costs", "block", "traces") if k not in data]
    if missing:
        raise TraceError(f"{path}: lacks {', '.join(missing)} (expected what `scheduler_replay.py record` writes)")
    c, traces, block = data["costs"], data["traces"], data["block"]
    if isinstance(block, bool) or not isinstance(block, int) or not 1 <= block <= MAX_BLOCK:
        raise TraceError(f"{path}: block: expected a whole number 1..{MAX_BLOCK}, found {block!r:.40}")
    if not isinstance(c, dict):
        raise TraceError(f"{path}: costs: expected an object of t_decode, t_propose and t_verify, found {json_type(c)}")
    for k in ("t_decode", "t_propose", "t_verify"):
        if k not in c:
            raise TraceError(f"{path}: costs: lacks {k}")
    tv = c["t_verify"]
    if not isinstance(tv, dict):
        raise TraceError(f"{path}: costs.t_verify: expected an object of verify widths to ms, found {json_type(tv)}")
    bad = [k for k in tv if not re.fullmatch(r"[1-9][0-9]{0,2}", k)]
    if bad:
        raise TraceError(f"{path}: costs.t_verify: expected widths written as whole numbers (\"2\" .. \"{block + 1}\"), "
                         f"found {bad[0]!r:.20}")
    widths = sorted(int(k) for k in tv)
    if widths != list(range(2, block + 2)):
        raise TraceError(f"{path}: costs.t_verify: expected the widths 2..{block + 1} (block {block}), found {widths}")
    costs = Costs(_cost(path, "t_decode", c["t_decode"]), _cost(path, "t_propose", c["t_propose"]),
                  {int(k): _cost(path, f"t_verify[{k}]", ms) for k, ms in tv.items()})
    if not isinstance(traces, list) or not traces:
        raise TraceError(f"{path}: traces: expected a non-empty array, found {json_type(traces)} ({traces!r:.40})")
    for i, t in enumerate(traces):
        if not isinstance(t, dict):
            raise TraceError(f"{path}: traces[{i}]: expected an object with an accepted array, found {json_type(t)}")
        if not isinstance(t.get("accepted"), list):
            raise TraceError(f"{path}: traces[{i}].accepted: expected an array of whole numbers 0..{block}, found "
                             f"{json_type(t.get('accepted'))} ({t.get('accepted')!r:.40})")
        for k in ("kind", "text"):
            if k in t and not isinstance(t[k], str):
                raise TraceError(f"{path}: traces[{i}].{k}: expected a string, found {json_type(t[k])}")
    return costs, block, traces


def _bad_number(v, lo: float, hi: float, whole: bool) -> bool:
    """Not a JSON number in lo..hi (a whole one if ``whole``): booleans, NaN and other types are bad."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (whole and not isinstance(v, int)):
        return True
    return not lo <= v <= hi


def _found(v) -> str:
    """A bad value as an error shows it: a float as Python prints it (nan, inf), else its JSON, cut short."""
    return str(v) if isinstance(v, float) else json.dumps(v)[:40]


#: The end of an error about a damaged confidence array: what to do.
DAMAGED = "; the file is damaged: record it again with `python tools/scheduler_replay.py record OUT`"


def check_confidence(path: Path, block: int, traces: list[dict]) -> None:
    """Each trace's ``accepted`` (whole numbers 0..block) and ``confidence`` (one array of at most
    ``block`` numbers in [0, 1] per position, at least as many as the drafts accepted there), and at
    least one confidence in the file; raises TraceError naming the first that is not."""
    anchors = 0
    for i, t in enumerate(traces):
        acc = t["accepted"]
        if not acc:
            raise TraceError(f"{path}: traces[{i}].accepted holds no positions; expected what "
                             f"`scheduler_replay.py record` writes")
        for j, a in enumerate(acc):
            if _bad_number(a, 0, block, True):
                raise TraceError(f"{path}: traces[{i}].accepted[{j}]: expected a whole number 0..{block}, found "
                                 f"{_found(a)}")
        if "confidence" not in t:
            raise TraceError(f"{path}: traces[{i}] has no confidence array (a file recorded before 2026-12-05); "
                             f"record it again with `python tools/scheduler_replay.py record`, which keeps them")
        conf = t["confidence"]
        if not isinstance(conf, list) or len(conf) != len(acc):
            found = f"{len(conf)} entries" if isinstance(conf, list) else json_type(conf)
            raise TraceError(f"{path}: traces[{i}].confidence: expected one array of confidences per position "
                             f"({len(acc)}), found {found}" + DAMAGED)
        for j, c in enumerate(conf):
            if not isinstance(c, list):
                raise TraceError(f"{path}: traces[{i}].confidence[{j}]: expected an array of at most {block} numbers "
                                 f"in [0, 1], found {json_type(c)}" + DAMAGED)
            if len(c) > block:
                raise TraceError(f"{path}: traces[{i}].confidence[{j}]: expected at most {block} numbers in [0, 1], "
                                 f"found {len(c)}" + DAMAGED)
            bad = [k for k, v in enumerate(c) if _bad_number(v, 0.0, 1.0, False)]
            if bad:
                raise TraceError(f"{path}: traces[{i}].confidence[{j}][{bad[0]}]: expected a number in [0, 1], "
                                 f"found {_found(c[bad[0]])}" + DAMAGED)
            if len(c) < acc[j]:
                raise TraceError(f"{path}: traces[{i}].confidence[{j}]: {len(c)} confidences where "
                                 f"traces[{i}].accepted[{j}] says {acc[j]} drafts were accepted (a draft accepted "
                                 f"was proposed, with its confidence)" + DAMAGED)
            anchors += bool(c)
    if not anchors:
        raise TraceError(f"{path}: no position holds a confidence: nothing to study or to replay with the confidence "
                         f"policy (record with `python tools/scheduler_replay.py record`)")


def _shown(text: str) -> str:
    """Text as this terminal can print it: a lone surrogate of a damaged file and control characters
    escaped."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def replay(path: Path, n_tokens: int | None, after: list[int] | None, as_json: bool) -> int:
    """Replay the traces of ``path`` (``n_tokens`` each; None: 255, or the shortest trace's length when
    that is less; ``after`` None: :data:`DEFAULT_AFTER` where the file holds them); 0, else 1 or 2 after a
    one-line error."""
    try:
        costs, block, traces = load_traces(path)
    except TraceError as exc:
        print(f"scheduler_replay: error: {exc}", file=sys.stderr)
        return 1
    empty = [i for i, t in enumerate(traces) if not t["accepted"]]
    if empty:
        print(f"scheduler_replay: error: {path}: traces[{empty[0]}].accepted holds no positions; expected what "
              f"`scheduler_replay.py record` writes", file=sys.stderr)
        return 1
    if n_tokens is None:
        n_tokens = min(DEFAULT_REPLAY_TOKENS, *(len(t["accepted"]) for t in traces))
        if n_tokens < DEFAULT_REPLAY_TOKENS:
            i = min(range(len(traces)), key=lambda k: len(traces[k]["accepted"]))
            print(f"scheduler_replay: note: {n_tokens} tokens each, the positions of the shortest trace ({i}); "
                  f"--tokens N replays N", file=sys.stderr)
    if after is None:  # the bench's code and prose prompts, those the file holds
        after = [i for i in DEFAULT_AFTER if i < len(traces)]
    for i in after:
        if not 0 <= i < len(traces):
            print(f"scheduler_replay: error: --after {i}: expected a prompt index 0..{len(traces) - 1} of {path}",
                  file=sys.stderr)
            return 2
    short = [i for i, t in enumerate(traces) if len(t["accepted"]) < n_tokens]
    if short:
        print(f"scheduler_replay: error: --tokens {n_tokens}: trace {short[0]} of {path} holds "
              f"{len(traces[short[0]]['accepted'])} positions; record longer ones or replay fewer", file=sys.stderr)
        return 2
    try:
        return _replay(path, costs, block, traces, n_tokens, after, as_json)
    except TraceError as exc:
        print(f"scheduler_replay: error: {exc}", file=sys.stderr)
        return 1


def _replay(path: Path, costs: Costs, block, traces: list[dict], n_tokens: int, after: list[int],
            as_json: bool) -> int:
    where = {"i": 0}

    lacking = [i for i, t in enumerate(traces) if "confidence" not in t]
    has_conf = not lacking
    notes = []
    if has_conf:
        check_confidence(path, block, traces)
    elif len(lacking) < len(traces):  # a file record writes holds them in every trace or in none
        raise TraceError(f"{path}: traces[{lacking[0]}] has no confidence array where {len(traces) - len(lacking)} of "
                         f"the {len(traces)} traces hold one" + DAMAGED)
    else:
        notes.append(f"{path} holds no confidences (recorded before 2026-12-05): the confidence policy is left out; "
                     f"record the traces again with `python tools/scheduler_replay.py record` to replay it")
        print(f"scheduler_replay: note: {notes[-1]}", file=sys.stderr)
    policies = [p for p in SCHEDULER_POLICIES if has_conf or p == "acceptance"]

    def run(i, policy="acceptance", **kw):
        where["i"] = i
        t = traces[i]
        try:
            return replay_scheduler(t["accepted"], n_tokens, costs, block=block, policy=policy,
                                    confidence=t["confidence"] if has_conf else None, **kw)
        except ValueError as exc:  # the costs and block were checked on loading: the trace's values
            raise TraceError(f"{path}: traces[{where['i']}]: {exc}") from None

    def engine_prices(i, policy):
        """The engine's kept prices after a fresh session on trace i (Engine: merged, then capped)."""
        return SchedulerPrices().merged(None, run(i, policy).end)

    kept = {(i, pol): engine_prices(i, pol) for i in after for pol in policies}
    arms = ["no scheduler"] + [f"{pol}, {a}" for pol in policies for a in ["fresh"] + [f"after {i}" for i in after]]
    rows = []
    for i, t in enumerate(traces):
        res = {"no scheduler": run(i, scheduler=False)}
        for pol in policies:
            res[f"{pol}, fresh"] = run(i, pol)
            for j in after:
                res[f"{pol}, after {j}"] = run(i, pol, start=kept[(j, pol)].capped(), kept=True)
        rows.append({"kind": _shown(t.get("kind", "?")), "text": _shown(t.get("text", ""))[:48],
                     **{a: {"ratio": r.ratio_to_target(costs.t_decode), "drafted_cycles": r.drafted_cycles,
                            "accepted": r.accepted, "proposed": r.proposed} for a, r in res.items()}})
    summary = {}
    for a in arms:
        xs = [r[a]["ratio"] for r in rows]
        summary[a] = {"min": min(xs), "mean": statistics.mean(xs), "below_0.99": sum(x < 0.99 for x in xs)}
    best = statistics.mean(max(1.0, r["no scheduler"]["ratio"]) for r in rows)
    if as_json:
        c = {"t_decode": costs.t_decode, "t_propose": costs.t_propose,
             "t_verify": {str(n): ms for n, ms in sorted(costs.t_verify.items())}}
        print(json.dumps({"traces": str(path), "tokens": n_tokens, "costs": c, "policies": policies, "notes": notes,
                          "arms": arms, "rows": rows, "summary": summary, "mean_of_better_of_on_and_off": best}))
        return 0
    print(f"{len(rows)} traces, {n_tokens} tokens each; costs: decode {costs.t_decode:.3f} ms, proposal "
          f"{costs.t_propose:.3f} ms, verify " + ", ".join(f"{n} rows {ms:.3f}" for n, ms in sorted(costs.t_verify.items()))
          + " ms")
    print("rate over target-only (drafted cycles): " + " | ".join(arms))
    for r in rows:
        print(f"  {r['kind']:8s} " + "  ".join(f"{r[a]['ratio']:.3f} ({r[a]['drafted_cycles']:3d})" for a in arms)
              + f"  {r['text']!r}")
    for a in arms:
        s = summary[a]
        print(f"{a:24s} min {s['min']:.3f}  mean {s['mean']:.4f}  below 0.99: {s['below_0.99']} of {len(rows)}")
    print(f"the better of target-only and the scheduler off, per prompt, averaged: {best:.4f}")
    return 0


MAX_RECORD_TOKENS = 8192
"""The longest trace ``record`` takes (each position is a drafted step: ~8 ms on 2 cores)."""


def _count(lo: int, hi: int):
    """An argparse type: a whole number lo..hi written in ASCII digits."""
    def parse(text: str) -> int:
        if not re.fullmatch(r"-?[0-9]+", text.strip()):
            raise argparse.ArgumentTypeError(f"expected a whole number {lo}..{hi}, found {text!r}")
        v = int(text)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected {lo}..{hi}, found {v}")
        return v
    return parse


def _writable(out: Path) -> str | None:
    """Why ``out`` cannot be written, or None: checked before minutes of recording by creating (and
    removing) the file the recording is written to first, ``OUT.partial``, so that what the system
    refuses (a read-only or virtual file system, permissions that root's ``os.access`` does not see) is
    found now; ``out`` itself is not touched."""
    parent = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        return "it is a folder"
    if out.exists() and not out.is_file():
        return "it is not a regular file (a device, a pipe, ...); give a file to write"
    if not parent.is_dir():
        return f"its folder {parent} does not exist"
    if out.exists() and not os.access(out, os.W_OK):
        return "it cannot be written"
    tmp = out.with_name(out.name + ".partial")
    try:
        with open(tmp, "x"):
            pass
    except FileExistsError:
        return f"{tmp} exists (an earlier recording's leftover?); remove it first"
    except OSError as exc:
        return f"a file cannot be created in {parent} ({exc.strerror})"
    tmp.unlink(missing_ok=True)
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Record acceptance traces of the demo pair (or of another pair), or "
                                 "replay the DSpark scheduler on them (spec dspark.md §7.5).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record traces and costs of the demo pair (or of --model and --mtp)")
    r.add_argument("out", help="the traces file to write (JSON)")
    r.add_argument("--tokens", type=_count(1, MAX_RECORD_TOKENS), default=512,
                   help=f"positions a trace records, 1..{MAX_RECORD_TOKENS} (default 512)")
    r.add_argument("--threads", type=_count(1, 256), default=2, help="engine threads, 1..256 (default 2)")
    r.add_argument("--model", help="a target DS4 GGUF to record instead of the demo pair's (with --mtp)")
    r.add_argument("--mtp", help="its DSpark support GGUF (with --model)")
    r.add_argument("--amx", choices=("auto", "on", "off"), default="auto",
                   help="the Q8_0 products on the AMX tiles (spec ds4.md §2.9.6): the same acceptance, other costs "
                        "(default auto)")
    p = sub.add_parser("replay", help="replay the scheduler on recorded traces: the scheduler off, then each policy "
                       "(acceptance; confidence where the file holds confidences) fresh and after the --after prompts")
    p.add_argument("traces", type=Path, help="a file `record` wrote")
    p.add_argument("--tokens", type=_count(1, 1 << 24), default=None,
                   help=f"tokens each replay emits (default {DEFAULT_REPLAY_TOKENS}, as bench --ab's timed steps, or "
                   f"the shortest trace's positions when fewer)")
    p.add_argument("--after", default=None, help="prompt indexes whose fresh session comes first for the kept "
                   "arms (default 0,1: the bench's code and prose prompts, those the file holds; empty: none)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    a = ap.parse_args(argv)
    if a.cmd == "record":
        if not a.out:
            r.error("OUT is empty; give the file to write, e.g. traces.json")
        a.out = Path(a.out)
        a.model, a.mtp = (None if v is None else (Path(v) if v else "") for v in (a.model, a.mtp))
        why = _writable(a.out)
        if why:
            print(f"scheduler_replay: error: {a.out}: cannot be written ({why}); give a path in a writable folder",
                  file=sys.stderr)
            return 1
        if (a.model is None) != (a.mtp is None):
            r.error(f"--model and --mtp go together: give a target GGUF and its DSpark support GGUF, or neither "
                    f"for the demo pair (found only {'--model' if a.mtp is None else '--mtp'})")
        for flag, f in (("--model", a.model), ("--mtp", a.mtp)):
            if f is not None and not str(f):
                r.error(f"{flag} is empty; give the path of a GGUF file")
            if f is not None and not f.is_file():
                why = "a folder" if f.is_dir() else "not a regular file" if f.exists() else "no such file"
                r.error(f"{flag} {f}: {why}; give the path of a GGUF file")
            if f is not None and a.out.exists() and a.out.resolve() == f.resolve():
                r.error(f"{a.out} is the {flag} file: the recording would replace it; give another OUT")
        return record(a.out, a.tokens, a.threads, (a.model, a.mtp) if a.model else None, a.amx)
    if a.after is None:
        return replay(a.traces, a.tokens, None, a.json)
    parts = [x.strip() for x in a.after.split(",") if x.strip()]
    if any(not re.fullmatch(r"[0-9]+", x) for x in parts):
        p.error(f"--after: expected prompt indexes (whole numbers) separated by commas, found {a.after!r}")
    after = list(dict.fromkeys(int(x) for x in parts))
    return replay(a.traces, a.tokens, after, a.json)


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except (EngineError, ModelFileError) as exc:  # the native engine not built, a pair that does not open
        print(f"scheduler_replay: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print("scheduler_replay: interrupted (nothing written)", file=sys.stderr)
        raise SystemExit(130) from None
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as a shell tool does
        quiet_broken_pipe()
