"""``ds4tui generate``: one prompt in, streamed text out, headless (like ds4's ``-p``).

The prompt is rendered with the DS4 chat template (spec ds4.md §4.3; ``--nothink`` for the
non-thinking generation prompt, ``--raw`` to tokenize the text as it is), prefilled in chunks and
decoded until EOS, ``-n`` tokens or a full context.  Text streams to stdout as tokens arrive (an incremental UTF-8
decoder holds back a multi-byte character until it is complete).  With ``--json`` nothing streams:
one JSON object is printed at the end with the prompt and generated token ids, the text, timings,
the session's counters and memory.

DSpark (spec dspark.md): ``--mtp SUPPORT`` attaches a support GGUF and turns DSpark on, unlike ds4,
which also needs ``--dspark`` (§7.2) and otherwise loads the support model and silently never
drafts; ``--no-dspark`` keeps the file loaded and runs target-only.  ``--no-scheduler``, ``--scheduler-policy P``,
``--confidence C`` and ``--max-draft N`` set the knobs (with ``--no-dspark`` a note on stderr says
that they have no effect, as it says of a ``--scheduler-prices`` other than saved).  A support file that fails validation is
refused with a warning naming the file and the reason, and generation continues target-only (every
cycle then counts as no_draft reason ``support_invalid``).  Each step returns the accepted drafts
followed by the next sampled token, so ``--json`` marks each generated id ``from_draft`` or not and
carries the knobs, the full DSpark counters and ds4's stats line; without ``--json`` that line goes
to stderr at the end.  ``DS4_DSPARK_STATS=1`` prints it when the session closes, as ds4 does
(``=0``: no line at all), and
``DS4_DSPARK_SCHEDULER`` / ``DS4_DSPARK_MAX_DRAFT_TOKENS`` set the knobs the session starts with (the
options above change them); ``DS4TUI_GPU_LAYOUT`` and ``DS4TUI_GPU_LIB`` apply to ``--backend hip``.
The command line reads and checks these (:mod:`ds4tui.commands.environment`); a
``DS4_DSPARK_MAX_DRAFT_TOKENS`` above the support model's block size is a usage error (status 2).

Errors (bad model file, a backend that cannot run) print one line to stderr and return 1; a usage
error (an empty or blank prompt, in chat mode as with ``--raw``: the template alone asks nothing; an
option that needs another one, ``--dspark`` without ``--mtp``; a ``--ctx`` outside 2..the
model's context length or too small for the prompt, checked once the prompt is tokenized from the
file's metadata, before the weights load) returns 2.  A ``-n`` beyond what the model's context
holds after the prompt is capped to it with a note on stderr (``--json``: ``n_predict``), and the
context is sized prompt + ``-n``.  A ``--prefill-gemm`` or ``--gpu-graphs on`` the chosen backend does not
apply (auto fell back to the cpu) is a note on stderr; ``--json`` carries ``prefill_gemm`` and its note; Ctrl-C stops decoding,
keeps what was printed and returns 130 (``--json``: the object of what was generated, marked ``"ok": false,
"interrupted": true`` as every interrupted command's, with ``stop`` ``"interrupted"``).  ``--verify-head`` (spec dspark.md §3.4; default auto: lazy on
the cpu backend) says which rows of a DSpark verify get the LM head; ``--json`` carries ``verify_head``
and its note, and the DSpark counters ``verify_head_rows``.  ``--scheduler-prices`` (spec dspark.md §7.4; default saved) says
where the DSpark scheduler starts; a saved file that cannot be used is a note on stderr and is
ignored; when the scheduler drafts, a note on stderr says where it started (the file of kept prices and
when they were last timed, or fresh and why: two runs of one command draft differently when the first
keeps prices the second starts from), and ``--json`` carries the mode, its note, the file, ``scheduler_prices_at_start`` and
``scheduler_prices_retime`` (why kept verify and proposal times were left for the session to re-time:
their age, or a change in the other work on the machine, ``scheduler_other_work_cores``) and
``scheduler_prices_retimed`` (the kept times the run's own drafting timed again, each with its kept and
its current ms: ``Session.scheduler_prices_retimed``; a note on stderr lists them too).
"""

from __future__ import annotations

import argparse
import codecs
import json
import sys
import time

from ds4tui.commands.environment import (BadVariable, backend_chosen, backend_unavailable, check_model_path,
                                         check_support_block, check_support_path,
                                         draft_vocab_notes, verify_head_notes, gpu_options_not_applied,
                                         file_error, greedy_sampling_notes, scheduler_prices_notes, settings_of)
from ds4tui.commands.tokenize import _check_arg_text, read_text_file
from ds4tui.engine import prices
from ds4tui.engine.decode import DecodeLoop
from ds4tui.engine.draft_vocab import DraftVocabError
from ds4tui.engine.gguf_model import DS4Model, ModelFileError
from ds4tui.engine.stats import format_line
from ds4tui.engine.tokenizer import Tokenizer, TokenizerError, render_chat
from ds4tui.interrupts import interrupted_result, print_whole

_PREFIX = "ds4tui generate: error:"


def _fail(message: str, as_json: bool, status: int = 1) -> int:
    print(f"{_PREFIX} {message}", file=sys.stderr)
    if as_json:
        print(json.dumps({"ok": False, "error": message}))
    return status


def prompt_ids(tokenizer: Tokenizer, text: str, *, raw: bool, think: bool, system: str | None) -> list[int]:
    """Token ids of the prompt: the chat template around ``text``, or ``text`` encoded as it is."""
    if raw:
        return tokenizer.encode(text)
    return render_chat(tokenizer, [{"role": "user", "content": text}], think=think, system=system or None)


def _dspark_usage(args: argparse.Namespace) -> str | None:
    """Why the DSpark options cannot be used as given (None when they can).  Decided from the
    command line alone, before the demo pair is unpacked: without MODEL the demo's support model
    is attached unless ``--mtp`` names another or the backend is the reference (which does not draft)."""
    if args.mtp is not None:
        if args.backend == "reference":
            return ("--mtp needs a backend that drafts, found --backend reference (the numpy oracle does not draft): "
                    "use --backend auto, cpu or hip")
        return None
    if args.model is None and args.backend != "reference":
        return None  # the demo's drafter
    given = [flag for flag, on in (("--dspark", args.dspark is True), ("--no-scheduler", args.no_scheduler),
                                   ("--scheduler-policy", args.scheduler_policy is not None),
                                   ("--confidence", args.confidence is not None),
                                   ("--max-draft", args.max_draft is not None)) if on]
    if given and args.backend == "reference":
        return (f"{given[0]} needs a backend that drafts, found --backend reference (the numpy oracle does not "
                f"draft): use --backend auto, cpu or hip, or leave out {' '.join(given)}")
    if given:
        return (f"{given[0]} needs a DSpark support model: add --mtp SUPPORT.gguf (DSpark is then on by default), "
                f"or leave out {' '.join(given)}")
    return None


def _moot_knobs(args: argparse.Namespace) -> str | None:
    """The note for DSpark knobs given with ``--no-dspark`` (None when there are none; with DSpark on, the
    note for ``--scheduler-policy`` beside ``--no-scheduler``, which leaves it nothing to decide): drafting is
    off for the whole run, so ``--no-scheduler``, ``--confidence``, ``--max-draft``, a
    ``--draft-vocab`` or ``--verify-head`` other than auto and a ``--scheduler-prices`` other than
    saved (no scheduler decides a draft) change nothing (not an error: they are valid, only moot).
    ``saved``, the default, is not noted: the run keeps its plain decode's time in the prices file."""
    if args.dspark is not False:
        if args.no_scheduler and args.scheduler_policy is not None:
            return ("--scheduler-policy has no effect because --no-scheduler turns the scheduler off (every cycle "
                    "verifies the whole proposal); leave out --no-scheduler for the policy to decide")
        return None
    given = [flag for flag, on in (("--no-scheduler", args.no_scheduler),
                                   ("--scheduler-policy", args.scheduler_policy is not None),
                                   ("--confidence", args.confidence is not None),
                                   ("--max-draft", args.max_draft is not None),
                                   ("--draft-vocab", getattr(args, "draft_vocab", None) not in (None, "auto")),
                                   ("--verify-head", getattr(args, "verify_head", None) not in (None, "auto")),
                                   ("--scheduler-prices", getattr(args, "scheduler_prices", None) not in (None, "saved")))
             if on]
    if not given:
        return None
    flags = given[0] if len(given) == 1 else f"{', '.join(given[:-1])} and {given[-1]}"
    return (f"{flags} {'has' if len(given) == 1 else 'have'} no effect because --no-dspark turns drafting off "
            f"(every cycle decodes target-only; leave out --no-dspark to draft)")


def _scheduler_decides(engine, session) -> bool:
    """Whether the DSpark scheduler decides what ``session`` drafts: a support model attached and the
    knobs as set (``--no-dspark``, ``--no-scheduler`` and ``DS4_DSPARK_SCHEDULER=0`` turn it off)."""
    if engine.support_status != "attached":
        return False
    k = session.dspark
    return k.enabled and k.scheduler


def _setup_dspark(engine, session, args: argparse.Namespace) -> None:
    """Apply the DSpark options to a session whose engine has a support model attached.  Raises
    ValueError naming the option for a knob out of range."""
    knobs: dict = {"enabled": args.dspark is not False}
    if args.no_scheduler:
        knobs["scheduler"] = False
    if args.scheduler_policy is not None:
        knobs["policy"] = args.scheduler_policy
    if args.confidence is not None:
        knobs["threshold"] = args.confidence
    if args.max_draft is not None:
        if args.max_draft > engine.block_size:
            raise ValueError(f"--max-draft {args.max_draft} exceeds the support model's block size "
                             f"{engine.block_size} (use 1..{engine.block_size})")
        knobs["max_draft"] = args.max_draft
    session.set_dspark(**knobs)


def run(args: argparse.Namespace) -> int:
    from ds4tui.engine import session as S

    as_json = args.json
    settings = settings_of(args)
    # usage errors that the command line alone shows come before any slow work (unpacking the demo)
    why = _dspark_usage(args)
    given = [flag for flag, on in (("--system", args.system is not None), ("--nothink", args.nothink)) if on]
    if args.raw and given:  # they would go unused, the system text without a word (as tokenize refuses them)
        why = (f"{' and '.join(given)} {'applies' if len(given) == 1 else 'apply'} to the chat template, which --raw "
               f"leaves out: leave out --raw, or {' '.join(given)}"
               f"{' (with --raw, write a system text into the prompt)' if args.system is not None else ''}")
    if why:
        return _fail(why, as_json, status=2)  # a usage error, as argparse's
    if sys.stdout is None:  # closed (>&-): Python leaves None there, and the answer would go nowhere
        return _fail("standard output is closed (>&-): the answer has nowhere to go; redirect it instead, e.g. "
                     "> answer.txt (or > /dev/null to time a run)", False)
    moot = _moot_knobs(args)
    if moot:  # on stderr with --json too, as every other note
        print(f"ds4tui generate: note: {moot}", file=sys.stderr, flush=True)
    if args.model is None and args.ctx is not None and args.ctx < 2:
        return _fail(f"argument --ctx: expected at least 2 (a prompt token and one to generate), found {args.ctx}",
                     as_json, status=2)
    try:
        text = _check_arg_text(args.prompt, "--prompt") if args.file is None else _read(args.file)
        system = _check_arg_text(args.system, "--system") if args.system else None
    except TokenizerError as exc:
        return _fail(str(exc), as_json)
    if not text.strip():  # in chat mode too: the template alone is not a question
        where = "argument --prompt" if args.file is None else (
            f"argument --file: {'<stdin>' if args.file == '-' else args.file}")
        return _fail(f"{where}: the prompt is empty{' (only whitespace)' if text else ''}: give the text to "
                     f"answer (-p TEXT, or -f FILE)", as_json, status=2)
    try:  # the files named, before the demo unpacks or anything loads: the model first, as loading would
        if args.model is not None:
            check_model_path(args.model)
        if args.mtp is not None:
            check_support_path(args.mtp)
    except ModelFileError as exc:
        return _fail(str(exc), as_json)
    try:  # the engine itself, before the demo unpacks (99 MiB on first use) only for the engine to be missing
        S.require_native(args.backend)
    except S.NativeNotBuiltError as exc:
        return _fail(backend_unavailable(args.backend, exc), as_json)
    if args.model is None:
        from ds4tui.demo import DemoError, demo_pair, stderr_progress

        try:
            pair = demo_pair(None if as_json else stderr_progress)
        except DemoError as exc:
            return _fail(str(exc), as_json)
        if pair is None:
            return _fail("no MODEL given and this build has no bundled demo model", as_json, status=2)
        for line in pair.repaired:  # a damaged file unpacked again: said, with --json too
            print(f"ds4tui generate: note: {line}", file=sys.stderr, flush=True)
        args.model = str(pair.model)
        args.demo_folder = str(pair.model.parent)  # named by a model error (the user gave no path)
        if args.mtp is None:
            if args.backend != "reference":
                args.mtp = str(pair.support)
            else:  # on stderr with --json too, as every other note
                print("ds4tui generate: note: the reference backend does not draft, so the demo's DSpark support "
                      "model is not attached", file=sys.stderr)
    try:  # options bounded by the support model's block size: checked before anything loads
        check_support_block(args.mtp, args.max_draft, settings)
    except ValueError as exc:  # BadVariable too
        return _fail(str(exc), as_json, status=2)
    t_start = time.perf_counter()
    engine = session = None
    prices_problem = ""
    try:
        try:
            params = S.SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                                      seed=args.seed).validate()
            model = DS4Model(args.model)  # the metadata: --ctx is checked against it before the engine loads
            limit = model.config.context_length
            if args.ctx is not None and not 2 <= args.ctx <= limit:
                return _fail(f"argument --ctx: expected 2..{limit} (the context length of {args.model}), found "
                             f"{args.ctx}", as_json, status=2)
            # the tokenizer is in the metadata too: the prompt is measured before the weights load
            tokenizer = Tokenizer.from_gguf(model.reader)
            ids = prompt_ids(tokenizer, text, raw=args.raw, think=not args.nothink, system=system)
            if not ids:
                return _fail("the prompt is empty (nothing to prefill)", as_json)
            if args.ctx is not None and len(ids) + 1 > args.ctx:
                return _fail(f"argument --ctx: expected at least {len(ids) + 1} (the prompt's {len(ids)} tokens "
                             f"+ 1 to generate; known once the prompt is tokenized), found {args.ctx}",
                             as_json, status=2)
            if len(ids) + 1 > limit:
                return _fail(f"the prompt has {len(ids)} tokens, which leaves no room in the context length "
                             f"{limit} of {args.model} (shorten the prompt)", as_json, status=2)
            if args.ctx is None and len(ids) + args.n_predict > limit:  # -n capped to what fits, said
                capped = limit - len(ids)
                print(f"ds4tui generate: note: -n {args.n_predict} capped to {capped}: the prompt's {len(ids)} "
                      f"tokens + {capped} fill the model's context length {limit} (the context is sized prompt + -n)", file=sys.stderr, flush=True)
                args.n_predict = capped
            n_ctx = args.ctx or len(ids) + args.n_predict
            engine = S.Engine(model, backend=args.backend, numerics=args.numerics, n_threads=args.threads,
                              support=args.mtp, activations=args.activations, **settings.engine_options(),
                              **settings.price_options())
            if args.backend == "auto" and engine.backend_note:
                print(f"ds4tui generate: {backend_chosen(engine)}", file=sys.stderr, flush=True)
            if engine.threads_note:  # more threads than usable cores: run as asked, said
                print(f"ds4tui generate: note: {engine.threads_note}", file=sys.stderr, flush=True)
            for what in gpu_options_not_applied(settings, engine, args.prefill_gemm):
                print(f"ds4tui generate: note: {what}", file=sys.stderr, flush=True)
            for what in (draft_vocab_notes(settings, engine) + verify_head_notes(settings, engine)
                         + scheduler_prices_notes(args.scheduler_prices, engine)
                         + greedy_sampling_notes(args.temp, args.top_k, args.top_p, args.min_p, args.seed)):
                print(f"ds4tui generate: note: {what}", file=sys.stderr, flush=True)
            prices_problem = engine.scheduler_prices_problem
            if prices_problem:  # on stderr with --json too, as every other note
                print(f"ds4tui generate: note: {prices_problem}", file=sys.stderr, flush=True)
            if engine.support_status == "refused":
                print(f"ds4tui generate: warning: DSpark support model refused, continuing target-only "
                      f"(no drafting): {engine.support_message}", file=sys.stderr, flush=True)
            if engine.support_status == "attached":
                settings.check_block(engine.block_size, args.mtp)
            session = engine.session(n_ctx, **settings.session_options())
            session.set_sampling(params)
            if engine.support_status == "attached":
                _setup_dspark(engine, session, args)
                if _scheduler_decides(engine, session):
                    if not as_json:  # the JSON has scheduler_prices_at_start and scheduler_prices_note
                        print(f"ds4tui generate: note: scheduler prices: {prices_start_words(engine, session)}",
                              file=sys.stderr, flush=True)
                    if session.scheduler_prices_retime:
                        print(f"ds4tui generate: note: scheduler prices: {session.scheduler_prices_retime}",
                              file=sys.stderr, flush=True)
        except BadVariable as exc:
            return _fail(str(exc), as_json, status=2)  # a usage error, as a bad flag
        except DraftVocabError as exc:  # a choice the support file cannot meet: a usage error too
            return _fail(f"argument --draft-vocab: {exc.detail}", as_json, status=2)
        except S.BackendUnavailableError as exc:  # the backend's fault, not the model file's
            return _fail(backend_unavailable(args.backend, exc), as_json)
        except ModelFileError as exc:  # a file named on the command line that is not what its argument wants
            return _fail(file_error(exc, args.model, args.mtp), as_json)
        except (TokenizerError, S.EngineError, ValueError, OSError) as exc:
            return _fail(str(exc), as_json)
        return _generate(args, S, engine, session, tokenizer, text, ids, params, t_start, as_json, settings)
    finally:
        # Closing the session prints ds4's stats line when DS4_DSPARK_STATS is set.
        if session is not None:
            session.close()  # with --scheduler-prices saved this writes the prices file
        if engine is not None:
            if engine.scheduler_prices_problem and engine.scheduler_prices_problem != prices_problem:
                print(f"ds4tui generate: note: {engine.scheduler_prices_problem}", file=sys.stderr, flush=True)
            engine.close()


THINK_END = "</think>"


def _demo_hint(args, message: str) -> str:
    """What to add to an engine error about the model's numbers (non-finite logits): the model file it
    came from, and when the model is the bundled demo (the user named no file) how to have it checked
    and unpacked anew."""
    folder = getattr(args, "demo_folder", None)
    if "non-finite" not in message:
        return ""
    if not folder:  # a file the user named: which one the check should read
        return f" (the model: {args.model})"
    return (f" (the model is the bundled demo, {args.model}: if a file in {folder} changed after it was "
            f"unpacked, delete {folder}/*.verified and run again: the next start checks every byte and "
            f"unpacks a damaged file anew)")


def _split_reasoning(text: str, thinking: bool) -> dict:
    """``reasoning`` (the text before the first ``</think>`` of a thinking-mode answer, else None) and
    ``answer`` (the text after it; all of ``text`` otherwise, or when the reasoning never ended)."""
    if thinking and THINK_END in text:
        reasoning, answer = text.split(THINK_END, 1)
        return {"reasoning": reasoning, "answer": answer}
    return {"reasoning": None, "answer": text}


def _generate(args, S, engine, session, tokenizer, text, ids, params, t_start, as_json, settings) -> int:
    t_loaded = time.perf_counter()
    show_progress = not as_json and sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        if show_progress:
            print(f"\rprefill {done}/{total} tokens", end="", file=sys.stderr, flush=True)

    eos = tokenizer.eos_id
    # Each cycle: the accepted drafts, then the token sampled after them; EOS among the drafts ends
    # the cycle there and the loop rewinds the session to it.
    loop = DecodeLoop(session, args.n_predict, stop=(eos,))
    out_ids, from_draft = loop.ids, loop.from_draft
    pieces: list[str] = []
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    stop = "max_tokens"
    t_prefill_end = t_first = None
    # thinking mode: the reasoning ends at THINK_END; the printed answer starts on a line of its own
    thinking = not args.raw and not args.nothink
    reasoning_open = thinking

    def show(cycle) -> None:
        nonlocal reasoning_open
        for tok in cycle.tokens:
            if tok == eos:
                break
            piece = utf8.decode(tokenizer.token_bytes(tok))
            pieces.append(piece)
            if not as_json and piece:
                if reasoning_open and THINK_END in piece:  # the tag, then the answer on its own line
                    head, rest = piece.split(THINK_END, 1)
                    piece = head + THINK_END + ("" if rest.startswith("\n") else "\n") + rest
                    reasoning_open = False
                sys.stdout.write(piece)
        if not as_json:
            sys.stdout.flush()

    try:
        try:
            session.prefill(ids, progress=progress)
            t_prefill_end = time.perf_counter()
            if show_progress:
                print("\r" + " " * 40 + "\r", end="", file=sys.stderr, flush=True)
            for cycle in loop:
                if t_first is None:
                    t_first = time.perf_counter()
                show(cycle)
            # ctx: the context is full, the next token has no position to run at
            stop = {"stop": "eos", "ctx": "ctx"}.get(loop.reason, "max_tokens")
        except KeyboardInterrupt:
            stop = "interrupted"
            # the rest of the batch the engine already ran (its cycles are in the statistics): shown,
            # so that the answer, its token count and the DSpark line cover the same tokens
            for cycle in loop.computed_rest():
                show(cycle)
        except S.EngineError as exc:
            if not as_json and any(pieces):
                print(file=sys.stdout)  # ends the streamed line before the error
            return _fail(str(exc) + _demo_hint(args, str(exc)), as_json)
        t_end = time.perf_counter()
        tail = utf8_tail(utf8)
        pieces.append(tail)
        dspark = _dspark_result(engine, session)
        n_dec = len(out_ids)
        prefill_s = (t_prefill_end or t_end) - t_loaded
        # Decode rate over the steps that ran the model: the first step only samples the prefill's logits.
        decode_s = (t_end - t_first) if t_first is not None else 0.0
        prefill_tps = len(ids) / prefill_s if t_prefill_end and prefill_s > 0 else None
        decode_tps = (n_dec - 1) / decode_s if decode_s > 0 and n_dec > 1 else None
        if not as_json:
            sys.stdout.write(tail + "\n")
            sys.stdout.flush()
            if stop == "ctx":
                print(f"ds4tui generate: stopped: the context of {session.n_ctx} tokens is full (raise --ctx)",
                      file=sys.stderr)
            retimed = (prices.retimed_words(session.scheduler_prices_retimed())
                       if _scheduler_decides(engine, session) else "")  # as the note at the start
            if retimed:  # kept times the run's own drafting timed again (spec dspark.md §7.4, In-session)
                print(f"ds4tui generate: note: scheduler prices: {retimed}", file=sys.stderr)
            rates = rates_line(len(ids), prefill_s if t_prefill_end else None, prefill_tps, n_dec, decode_tps)
            print(f"ds4tui generate: {rates} ({engine.backend} backend)", file=sys.stderr)
            if dspark["ran"] and settings.dspark_stats is None:  # DS4_DSPARK_STATS unset
                print(dspark["dspark_line"], file=sys.stderr)  # =1: closing the session prints it; =0: no line
            if dspark["ran"] and not dspark["dspark_stats"]["t_decode_measured"]:
                print("ds4tui generate: note: saved/net_saved are unknown (printed as 0): every cycle drafted, so "
                      "no target-only decode was timed to price them (the scheduler times one; `ds4tui bench --ab` "
                      "compares whole runs)", file=sys.stderr)
            return 130 if stop == "interrupted" else 0  # the command line says "interrupted", once
    except BrokenPipeError:
        raise
    except OSError as exc:  # stdout is a full disk or otherwise unwritable
        print(f"{_PREFIX} cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        return 1
    st = session.stats()
    del dspark["ran"]
    result = {
        "ok": True,
        "model": str(engine.model.path),
        "backend": engine.backend,
        "backend_note": engine.backend_note,
        "backend_detail": engine.backend_detail,
        "numerics": engine.numerics,
        "activations": engine.activations,
        "activations_note": engine.activations_note,
        "prefill_gemm": engine.prefill_gemm,
        "prefill_gemm_note": engine.prefill_gemm_note,
        "gpu_graphs": engine.gpu_graphs,
        "gpu_graphs_note": engine.gpu_graphs_note,
        "draft_vocab": engine.draft_vocab,
        "draft_vocab_note": engine.draft_vocab_note,
        "verify_head": engine.verify_head,
        "verify_head_note": engine.verify_head_note,
        "amx": engine.amx,
        "amx_note": engine.amx_note,
        **_prices_result(engine, session),
        "n_predict": args.n_predict,
        "n_threads": engine.n_threads,
        "threads_note": engine.threads_note,
        "raw": bool(args.raw),
        "think": None if args.raw else not args.nothink,
        "sampling": {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
                     "min_p": params.min_p, "seed": params.seed},
        "system": args.system or None,  # --system's text (part of the prompt the chat template renders)
        "prompt": text,
        "prompt_ids": ids,
        "generated_ids": out_ids,
        "from_draft": from_draft,
        "text": "".join(pieces),
        **_split_reasoning("".join(pieces), thinking),
        "stop": stop,
        "n_ctx": session.n_ctx,
        # given, or sized by the run (compare then takes it as following from the prompt and -n)
        "n_ctx_note": (f"--ctx {args.ctx}: given" if args.ctx else
                       f"auto: the prompt's {len(ids)} tokens + -n {args.n_predict} (no --ctx)"),
        "timings": {
            "load_s": round(t_loaded - t_start, 4),
            "prefill_s": round(prefill_s, 4),
            "prefill_tokens_per_s": None if prefill_tps is None else round(prefill_tps, 3),
            "first_token_s": round(t_first - t_loaded, 4) if t_first is not None else None,
            "decode_s": round(decode_s, 4),
            "decode_tokens_per_s": None if decode_tps is None else round(decode_tps, 3),
        },
        "stats": st.to_dict(),
        **dspark,
        "memory": session.memory().to_dict(),
    }
    if stop == "interrupted":  # one convention for every command (ds4tui.interrupts): what was generated is kept
        del result["ok"]
        result = interrupted_result(
            f"interrupted after {n_dec} of the {args.n_predict} tokens asked (-n)" if t_prefill_end is not None
            else f"interrupted during the prefill of {len(ids)} prompt tokens; no token generated", **result)
    try:
        print_whole(json.dumps(result))  # one object, whatever a second Ctrl-C does meanwhile
    except BrokenPipeError:
        raise
    except OSError as exc:
        print(f"{_PREFIX} cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 130 if stop == "interrupted" else 0


def utf8_tail(decoder) -> str:
    """What an incremental UTF-8 decoder still holds at the end of the output: a complete
    character's text, or "" when -n (or EOS) cut a multi-byte character short (printing its bytes
    would show U+FFFD, a character the model never produced)."""
    held, _ = decoder.getstate()
    try:
        return held.decode("utf-8")
    except UnicodeDecodeError:
        return ""


def rates_line(n_prompt: int, prefill_s: float | None, prefill_tps: float | None, n_gen: int,
               decode_tps: float | None) -> str:
    """The speeds line ``generate`` ends with on stderr: prefill and decode tokens/s (the decode
    rate over the steps after the first, which only samples the prefill's logits), as ``--json``'s
    ``timings``."""
    pre = "not finished" if prefill_s is None or prefill_tps is None else \
        f"{prefill_s:.2f} s, {prefill_tps:.1f} tokens/s"
    dec = "— (fewer than 2 tokens)" if decode_tps is None else f"{decode_tps:.1f} tokens/s"
    def tokens(n: int) -> str:
        return f"{n} token" if n == 1 else f"{n} tokens"

    return f"prefill {tokens(n_prompt)}: {pre}; generated {tokens(n_gen)}, decode {dec}"


def _dspark_result(engine, session) -> dict:
    """The support model's state, the knobs, the DSpark counters and ds4's line (None where no
    support model was given); ``ran`` = the line is worth printing (drafting was on, or refused)."""
    support = {"path": str(engine.support.path) if engine.support is not None else None,
               "status": engine.support_status, "message": engine.support_message,
               "block_size": engine.block_size}
    if engine.support_status == "none":
        return {"support": support, "dspark": None, "dspark_stats": None, "dspark_line": None,
                "dspark_events": [], "ran": False}
    knobs = session.dspark
    st = session.dspark_stats()
    events = [{"cycle": e.cycle, "knobs": e.knobs.to_dict()} for e in session.dspark_events()]
    ran = bool(st.cycles or st.propose) and (knobs.enabled or engine.support_status == "refused")
    return {"support": support, "dspark": knobs.to_dict(), "dspark_stats": st.to_dict(),
            "dspark_line": format_line(st), "dspark_events": events, "ran": ran}


def prices_start_words(engine, session) -> str:
    """Where ``session``'s DSpark scheduler started (spec dspark.md §7.4), in words: the file of kept
    prices and when a session last timed them, or fresh and why.  Two runs of one command draft
    differently when the first keeps prices that the second starts from; this says which it was."""
    source, mode, path = session.scheduler_prices_at_start, engine.scheduler_prices, engine.scheduler_prices_file
    if source == "saved":
        kept = engine.kept_prices
        age = None if kept is None else kept.last_timed(time.time())
        return (f"started from the prices kept in {path}"
                + ("" if age is None else f", last timed {prices.age_words(age)} ago")
                + " (--scheduler-prices fresh starts without them)")
    if source == "engine":
        return "started from the prices this run's earlier sessions measured"
    if mode == "fresh":
        return "started fresh (--scheduler-prices fresh: the run measures its own)"
    if mode == "engine":
        return "started fresh (--scheduler-prices engine keeps prices within a run, and this is its first session)"
    if engine.scheduler_prices_problem:  # said in the note before
        return "started fresh: the kept prices could not be used (the note above says why)"
    if path is not None and prices.blocked(path) is not None:  # why, the note when the run closes says
        return f"started fresh: no prices kept yet in {path}, and this run cannot keep its own there (see below)"
    return f"started fresh: no prices kept yet in {path} (this run keeps its own there)"


def _prices_result(engine, session) -> dict:
    """The scheduler prices option (spec dspark.md §7.4): the mode, what it did (the note, the
    file, a problem with it) and where this session's scheduler started."""
    return {"scheduler_prices": engine.scheduler_prices, "scheduler_prices_note": engine.scheduler_prices_note,
            "scheduler_prices_file": None if engine.scheduler_prices_file is None else str(engine.scheduler_prices_file),
            "scheduler_prices_problem": engine.scheduler_prices_problem or None,
            "scheduler_prices_at_start": session.scheduler_prices_at_start,
            "scheduler_prices_retime": session.scheduler_prices_retime or None,
            "scheduler_prices_retimed": session.scheduler_prices_retimed(),
            "scheduler_other_work_cores": session.scheduler_other_work}


def _read(path: str) -> str:
    """The prompt file's text (UTF-8, at most 16 MiB); TokenizerError naming the file otherwise."""
    return read_text_file(path, "-f/--file", "a text file with the prompt",
                          "a prompt is at most that long: give a shorter one")
