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
import sys
from pathlib import Path

import numpy as np

from ds4tui.engine import draft_vocab as DV
from ds4tui.engine.errors import ConversionError, DraftVocabError
from ds4tui.engine.gguf_model import DS4Model, ModelFileError, SupportModel
from ds4tui.engine.tokenizer import Tokenizer, TokenizerError, render_chat

_PREFIX = "ds4tui draft-vocab: error:"


def _fail(message: str, status: int = 1) -> int:
    print(f"{_PREFIX} {message}", file=sys.stderr)
    return status


def template_ids(tok: Tokenizer) -> list[int]:
    """The tokens of the DS4 chat template itself (markers, think tags, end of sentence): those of a
    rendered conversation with empty texts, in both thinking modes, plus BOS and EOS."""
    ids: list[int] = [i for i in (tok.bos_id, tok.eos_id) if i is not None]
    turn = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}, {"role": "user", "content": ""}]
    for think in (True, False):
        ids += render_chat(tok, turn, think=think, add_generation_prompt=True)
    return list(dict.fromkeys(ids))


def run(args: argparse.Namespace) -> int:
    try:
        model = DS4Model(args.model)
        support = SupportModel(args.support, model.config, check_finite=False)
        if not support.compatible:
            return _fail(f"{args.support}: not a support model for {args.model}: {support.problems[0].message}")
        tok = Tokenizer.from_gguf(model.reader)
    except (ModelFileError, TokenizerError, OSError) as exc:
        return _fail(str(exc))
    files = 0
    counted = 0
    lists: list[list[int]] = []
    for src in args.sources:
        p = Path(src)
        if not p.exists():
            return _fail(f"--from {src}: no such file or folder", status=2)
    paths = []
    for src in args.sources:
        p = Path(src)
        paths += sorted(f for f in p.rglob(args.glob) if f.is_file()) if p.is_dir() else [p]
    for f in paths:
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        ids = tok.encode(text, parse_special=False)  # a file's text is plain text, markers included
        lists.append(ids)
        files += 1
        counted += len(ids)
    if not counted:
        return _fail(f"--from {' '.join(args.sources)}: no readable UTF-8 text (folders are read for "
                     f"{args.glob!r}; --glob chooses other files)", status=2)
    n_vocab = model.config.n_vocab
    ranked = DV.rank_tokens(lists, n_vocab, always=template_ids(tok))
    keep = ranked[: args.size]
    counts = np.zeros(n_vocab, np.int64)
    for ids in lists:
        counts += np.bincount(np.asarray(ids, dtype=np.int64), minlength=n_vocab)
    covered = float(counts[np.asarray(keep, dtype=np.int64)].sum() / counts.sum())
    try:
        out = DV.write_list(args.support, args.out, keep, n_vocab=n_vocab)
    except (DraftVocabError, ConversionError) as exc:
        return _fail(str(exc))
    result = {"ok": True, "out": str(out), "support": str(args.support), "model": str(args.model),
              "files": files, "tokens_counted": counted, "distinct": int((counts > 0).sum()),
              "draft_vocab": len(keep), "n_vocab": n_vocab, "coverage": round(covered, 6)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{out}: a draft vocabulary of {len(keep)} of {n_vocab} tokens (the chat template's "
              f"{len(template_ids(tok))} first), from {counted} tokens of {files} files ({result['distinct']} "
              f"distinct); the list covers {100 * covered:.2f} % of the tokens counted")
    return 0
