"""``ds4tui chat``: open the Textual app on a model (default: the bundled demo pair)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Callable

_PREFIX = "ds4tui chat:"

NO_DEMO = f"""{_PREFIX} no MODEL given and this build has no bundled demo model.
Make a small test model (random weights: the text is noise, the speculation panes are real) and open it:

    python -m ds4tui.devtools.make_test_model models/tiny
    ds4tui-fit-support models/tiny/model.gguf models/tiny/support.gguf models/tiny/fitted.gguf
    ds4tui chat models/tiny/model.gguf --mtp models/tiny/fitted.gguf

(the fitted support model drafts tokens the test model accepts about half of the time)."""


def options_from_args(args: argparse.Namespace, before_demo: Callable[[], None] | None = None):
    """Check the arguments and build the app's ``ChatOptions`` (ValueError with the reason; a file
    that cannot be read, the model or the ``--mtp`` file: ModelFileError naming it; no native engine:
    NativeNotBuiltError, before the demo pair is unpacked).
    ``before_demo`` is called once the command line's own checks passed and before the demo pair is
    unpacked (without MODEL): what it raises goes to the caller, with nothing unpacked."""
    from ds4tui.app import ChatOptions
    from ds4tui.commands.environment import (check_backend_options, check_model_path, check_support_block,
                                             check_support_path, settings_of)
    from ds4tui.demo import demo_pair, manifest, stderr_progress
    from ds4tui.engine.fs import fix_for, found_in, unwritable
    from ds4tui.engine.session import require_native

    model, support = args.model, args.mtp
    # the usage errors the command line alone shows come first, before any slow work (unpacking the
    # demo pair): without MODEL the demo's support model is attached unless --mtp names another
    drafter = support is not None or model is None
    if args.dspark and not drafter:
        raise ValueError("--dspark needs a support model: add --mtp SUPPORT.gguf")
    given = [flag for flag, on in (("--no-scheduler", getattr(args, "no_scheduler", False)),
                                   ("--scheduler-policy", getattr(args, "scheduler_policy", None) is not None),
                                   ("--confidence", getattr(args, "confidence", None) is not None),
                                   ("--max-draft", getattr(args, "max_draft", None) is not None)) if on]
    if given and not drafter:
        raise ValueError(f"{given[0]} needs a DSpark support model: add --mtp SUPPORT.gguf, or leave out "
                         f"{' '.join(given)}")
    if model is None and args.ctx is not None and args.ctx < 2:
        raise ValueError(f"argument --ctx: expected at least 2 (a prompt token and one to generate), found {args.ctx}")
    save_dir = Path(args.save_dir)
    if not save_dir.is_dir():
        what = "is a file, not a folder" if save_dir.exists() else "no such folder"
        raise ValueError(f"argument --save-dir: {save_dir}: {what} (Ctrl+S and F6 write there: give a folder)")
    code = unwritable(save_dir)
    if code is not None:
        raise ValueError(f"argument --save-dir: {save_dir}: cannot write there: found {found_in(save_dir, code)}; "
                         f"{fix_for(save_dir, code)}, or give another folder (Ctrl+S and F6 write there)")
    env = settings_of(args)
    activations = getattr(args, "activations", "auto")
    backend = args.backend
    # auto picks hip or cpu (both run q8, spec ds4.md §2.9.5) and says why in its backend_note,
    # which the welcome line shows as generate prints it
    check_backend_options(backend, activations, getattr(args, "prefill_gemm", None), env)
    if model is not None:  # before the demo is unpacked too; ModelFileError, in the words of generate and bench
        check_model_path(model)
    if support is not None:  # ModelFileError, in the words of generate and bench
        check_support_path(support)
    # every chat backend runs in the native engine: a missing one is said at once, as generate and
    # bench say it, not after the demo pair is unpacked (99 MiB on first use) and the app has opened
    require_native(backend)
    notes: tuple[str, ...] = ()
    if model is None:
        if manifest() is None:  # no bundled demo: said before anything else about running the app
            raise LookupError(NO_DEMO)
        if before_demo is not None:
            before_demo()
        pair = demo_pair(stderr_progress)  # DemoError when the bundled files cannot be unpacked
        if pair is None:
            raise LookupError(NO_DEMO)
        for line in pair.repaired:  # a damaged file unpacked again: said here and in the welcome line
            print(f"{_PREFIX} note: {line}", file=sys.stderr, flush=True)
        notes = pair.repaired
        model = str(pair.model)
        if support is None:
            support = str(pair.support)
    if args.ctx is not None:  # against the model's metadata, before the app loads it
        from ds4tui.engine.gguf_model import context_length_of

        limit = context_length_of(model)
        if args.ctx < 2 or (limit is not None and args.ctx > limit):
            raise ValueError(f"argument --ctx: expected 2..{limit or 'the context length'} (the context length of "
                             f"{model}), found {args.ctx}")
    check_support_block(support, getattr(args, "max_draft", None), env)
    return ChatOptions(model=model, support=support, dspark=args.dspark is not False, ctx=args.ctx,
                       backend=backend, threads=args.threads, temperature=args.temp, top_p=args.top_p,
                       seed=args.seed, top_k=args.top_k, min_p=args.min_p, numerics=args.numerics,
                       think=not args.nothink, system=args.system, max_tokens=args.n_predict,
                       save_dir=Path(args.save_dir), telemetry=args.telemetry or env.telemetry,
                       gpu_layout=env.gpu_layout, gpu_library=env.gpu_library, prefill_gemm=env.prefill_gemm,
                       activations=activations, gpu_graphs=env.gpu_graphs, draft_vocab=env.draft_vocab,
                       verify_head=env.verify_head, amx=env.amx,
                       **env.price_options(),
                       scheduler=env.dspark_scheduler and not getattr(args, "no_scheduler", False),
                       **({"policy": args.scheduler_policy} if getattr(args, "scheduler_policy", None) else {}),
                       max_draft=getattr(args, "max_draft", None) or env.dspark_max_draft,
                       threshold=getattr(args, "confidence", None) or 0.0, print_stats=bool(env.dspark_stats),
                       notes=notes)


class _NoTerminal(Exception):
    """The app cannot run here (the reason: :func:`terminal_problem`)."""


def _need_terminal() -> None:
    why = terminal_problem()
    if why:
        raise _NoTerminal(why)


def run(args: argparse.Namespace) -> int:
    from ds4tui.demo import DemoError
    from ds4tui.engine.errors import ModelFileError, NativeNotBuiltError

    try:
        # without a terminal the demo pair is not unpacked first (99 MiB) only to be refused after it
        options = options_from_args(args, before_demo=_need_terminal)
        _need_terminal()
    except _NoTerminal as exc:  # without one the app would draw into a pipe or file and wait for keys that never come
        print(f"{_PREFIX} error: the chat app needs a terminal: {exc}; run it in a terminal, or use `ds4tui generate` "
              f"for a run without one", file=sys.stderr)
        return 2
    except DemoError as exc:
        print(f"{_PREFIX} {exc}", file=sys.stderr)
        return 1
    except NativeNotBuiltError as exc:  # the line `ds4tui doctor` prints, with the command that builds it
        print(f"{_PREFIX} error: {exc}", file=sys.stderr)
        return 1
    except LookupError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    except (FileNotFoundError, ModelFileError) as exc:  # a file that cannot be read: status 1, as every command
        print(f"{_PREFIX} error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # a usage error, as a bad flag: one line, status 2, before anything loads
        print(f"{_PREFIX} error: {exc}", file=sys.stderr)
        return 2
    from ds4tui.app import DS4App

    app = DS4App(options)
    try:
        with _app_on_the_terminal():
            app.run()
    finally:
        # after the app: what closing prints (DS4_DSPARK_STATS's line) goes to stderr, and so does
        # a scheduler prices file it could not write (written as the session closes)
        note = app.close_engine()
        if note:
            print(f"{_PREFIX} note: {note}", file=sys.stderr, flush=True)
    return int(app.return_code or 0)


def terminal_problem() -> str:
    """Why the app cannot run here ("" when it can): it reads keys from standard input and draws on
    standard output, or on standard error when only that is a terminal (:func:`_app_on_the_terminal`)."""
    if not os.isatty(0):
        return "standard input is not one (it is redirected from a file or a pipe)"
    if not (os.isatty(1) or os.isatty(2)):
        return "neither standard output nor standard error is one (both are redirected)"
    try:
        size = os.get_terminal_size(1 if os.isatty(1) else 2)
    except OSError:  # no size to ask for: Textual falls back to its default
        return ""
    if size.columns <= 0 or size.lines <= 0:  # a pty with no window size (`script` with stdin redirected): the
        # app drew frame after frame at 0 x 0, a core busy, its signals never handled
        return (f"it reports a size of {size.columns} columns x {size.lines} rows (no window size was set on it; "
                f"give it one, e.g. `stty cols 120 rows 40`)")
    return ""


@contextlib.contextmanager
def _app_on_the_terminal():
    """The app draws on the terminal even when stderr is redirected (``ds4tui chat 2>log``):
    Textual writes to file descriptor 2, so while it runs that descriptor is the terminal of
    stdout, and the redirected stderr gets back what is printed after the app (the stats line)."""
    swap = not os.isatty(2) and os.isatty(1)
    saved = os.dup(2) if swap else None
    if swap:
        os.dup2(1, 2)
    try:
        yield
    finally:
        if saved is not None:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
