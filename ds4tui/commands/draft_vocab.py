"""``ds4tui draft-vocab``: write a draft vocabulary into a DSpark support GGUF (spec dspark.md §2.6).

``ds4tui draft-vocab MODEL SUPPORT --from PATH... [--glob '*.py'] [--size N] --out OUT`` counts the
tokens of the given files (folders: their files matching ``--glob``, recursively) under MODEL's
tokenizer, ranks them by count (ties: the lower id first) after the chat template's own tokens
(its markers and end-of-sentence, which plain files rarely hold), keeps the first ``--size`` and
writes a copy of SUPPORT with them under ``ds4tui.draft_vocab``.  It prints how many tokens were
counted, how many distinct ones occur and what share of the counted tokens the list covers.

Errors (one line on stderr, status 1; 2 for a usage error): an unreadable MODEL or SUPPORT, a
support file that is not compatible with MODEL, no readable text under ``--from``, an output that
cannot be written.  Nothing is written unless the whole copy is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from ds4tui.commands.environment import print_error_json
from ds4tui.commands.tokenize import MAX_INPUT_BYTES
from ds4tui.engine import draft_vocab as DV
from ds4tui.engine.errors import ConversionError, DraftVocabError
from ds4tui.engine.gguf_model import DS4Model, ModelFileError, SupportModel, special_file_kind
from ds4tui.engine.tokenizer import Tokenizer, TokenizerError, render_chat
from ds4tui.interrupts import print_whole

_PREFIX = "ds4tui draft-vocab: error:"


def _fail(message: str, status: int = 1, as_json: bool = False) -> int:
    """``message`` on stderr (and, for ``--json``, ``{"ok": false, "error": message}`` on stdout, as
    every command's failures are); returns ``status``."""
    print(f"{_PREFIX} {message}", file=sys.stderr)
    if as_json:
        print_error_json(message)
    return status


def template_ids(tok: Tokenizer) -> list[int]:
    """The tokens of the DS4 chat template itself (markers, think tags, end of sentence): those of a
    rendered conversation with empty texts, in both thinking modes, plus BOS and EOS."""
    ids: list[int] = [i for i in (tok.bos_id, tok.eos_id) if i is not None]
    turn = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}, {"role": "user", "content": ""}]
    for think in (True, False):
        ids += render_chat(tok, turn, think=think, add_generation_prompt=True)
    return list(dict.fromkeys(ids))


def _same(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def out_problem(out: Path, model: Path, support: Path, force: bool) -> str:
    """Why ``--out`` cannot be written ("" when it can): never the model, never anything but a
    regular file, never the demo's cached support file (the demo unpacks it again), an existing
    file other than SUPPORT only with ``--force``, and only in a folder that exists (checked before
    the files are counted, which can take a while)."""
    if not out.parent.is_dir():
        what = "is not a folder" if out.parent.exists() else "does not exist"
        return f"--out {out}: {out.parent} {what}: create the folder, or name a file in an existing one"
    if _same(out, model):
        return f"--out {out} is the model file {model}: write the support copy elsewhere"
    if out.exists() and not out.is_file():
        return f"--out {out} exists and is not a regular file (a folder or device): name a file"
    if _same(out, support):
        from ds4tui.demo import DemoError, cache_dir

        try:
            demo = cache_dir().resolve()
        except DemoError:
            demo = None
        if demo is not None and demo in out.resolve().parents:
            return (f"--out {out} is the bundled demo's unpacked support file, which the demo unpacks again when "
                    f"it changes: write the copy elsewhere (e.g. --out my-support.gguf) and use it with --mtp")
        return ""
    if out.exists() and not force:
        return f"--out {out} exists: pass --force to replace it (nothing was written)"
    return ""


def run(args: argparse.Namespace) -> int:
    if not args.out:
        return _fail("--out: an empty path (name the file to write)", status=2, as_json=args.json)
    out = Path(args.out)
    if out.is_symlink():  # the file it names is the one replaced (a support file kept behind a link)
        out = out.resolve()
    why = out_problem(out, Path(args.model), Path(args.support), args.force)
    if why:
        return _fail(why, status=2, as_json=args.json)
    try:
        # the two files in the wrong order: draft-vocab has no --mtp, the support file is its second argument
        model = DS4Model(args.model, support_hint=" (this is a DSpark support file: give the target model first, "
                         "then the support file: ds4tui draft-vocab MODEL.gguf SUPPORT.gguf --from PATH --out OUT.gguf)")
        support = SupportModel(args.support, model.config, check_finite=False)
        if not support.compatible:
            return _fail(f"{args.support}: not a support model for {args.model}: {support.problems[0].message}",
                         as_json=args.json)
        tok = Tokenizer.from_gguf(model.reader)
    except (ModelFileError, TokenizerError, OSError) as exc:
        return _fail(str(exc), as_json=args.json)
    files = 0
    counted = 0
    lists: list[list[int]] = []
    for src in args.sources:
        p = Path(src)
        if not p.exists():
            return _fail(f"--from {src}: no such file or folder", status=2, as_json=args.json)
        if not p.is_dir() and not p.is_file():  # a pipe would block the read until something writes to it
            return _fail(f"--from {src}: expected a text file or a folder, found {special_file_kind(p)}", status=2,
                         as_json=args.json)
    paths = []
    for src in args.sources:
        p = Path(src)
        paths += sorted(f for f in p.rglob(args.glob) if f.is_file()) if p.is_dir() else [p]
    skipped: list[str] = []
    for f in paths:
        try:  # a file past MAX_INPUT_BYTES (a model in the folder) is no source text: skipped, unread
            if f.stat().st_size > MAX_INPUT_BYTES:
                skipped.append(str(f))
                continue
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            skipped.append(str(f))
            continue
        ids = tok.encode(text, parse_special=False)  # a file's text is plain text, markers included
        lists.append(ids)
        files += 1
        counted += len(ids)
    if not counted:
        return _fail(f"--from {' '.join(args.sources)}: no readable UTF-8 text (folders are read for "
                     f"{args.glob!r}; --glob chooses other files)", status=2, as_json=args.json)
    n_vocab = model.config.n_vocab
    ranked = DV.rank_tokens(lists, n_vocab, always=template_ids(tok))
    keep = ranked[: args.size]
    counts = np.zeros(n_vocab, np.int64)
    for ids in lists:
        counts += np.bincount(np.asarray(ids, dtype=np.int64), minlength=n_vocab)
    covered = float(counts[np.asarray(keep, dtype=np.int64)].sum() / counts.sum())
    try:
        out = DV.write_list(args.support, out, keep, n_vocab=n_vocab)
    except (DraftVocabError, ConversionError) as exc:
        return _fail(str(exc), as_json=args.json)
    result = {"ok": True, "out": str(out), "support": str(args.support), "model": str(args.model),
              "files": files, "tokens_counted": counted, "distinct": int((counts > 0).sum()),
              "draft_vocab": len(keep), "n_vocab": n_vocab, "coverage": round(covered, 6), "skipped": skipped}
    if len(keep) < args.size:  # every token the files hold is listed: the rest can never be drafted
        print(f"ds4tui draft-vocab: note: the list holds {len(keep)} tokens, fewer than --size {args.size}: the files "
              f"hold no more distinct tokens (with the chat template's); the drafter never proposes any other, so "
              f"count more files (--from) for a longer list", file=sys.stderr)
    if skipped:  # named, never silent: not UTF-8 text, or unreadable
        print(f"ds4tui draft-vocab: note: {len(skipped)} file{'s' if len(skipped) > 1 else ''} skipped (not UTF-8 "
              f"text, over {MAX_INPUT_BYTES >> 20} MiB, or unreadable): {', '.join(skipped[:5])}"
              f"{' ...' if len(skipped) > 5 else ''}", file=sys.stderr)
    if args.json:
        print_whole(json.dumps(result))
    else:
        print(f"{out}: a draft vocabulary of {len(keep)} of {n_vocab} tokens (the chat template's "
              f"{len(template_ids(tok))} first), from {counted} tokens of {files} file{'s' if files != 1 else ''} ({result['distinct']} "
              f"distinct); the list covers {100 * covered:.2f} % of the tokens counted")
    return 0
