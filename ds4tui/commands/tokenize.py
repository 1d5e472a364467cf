"""``ds4tui tokenize``: token ids and pieces of a text under a DS4 GGUF's tokenizer.

Only the GGUF's ``tokenizer.ggml.*`` keys are read (ds4tui.engine.tokenizer). Plain text is
encoded with added-token strings recognised (so a pasted rendered prompt shows its markers as
single ids); with ``--chat`` the text becomes the user message of a single-turn DS4 chat prompt
(spec ds4.md §4.3), where it is always plain text.

Output: a table (id, piece) with a token count, ``--ids-only`` a Python-style list, or
``--json`` one object ``{"n_tokens", "ids", "pieces", "bytes"}`` (bytes: each token's UTF-8 bytes in hex). User errors print one line to stderr
and return 1 (2 for a usage error: flags that do not go together).

An empty text is not an error here, unlike ``generate``'s empty prompt: counting tokens, an empty
file has 0 of them (as ``wc`` counts 0 words), and with ``--chat`` the template alone is what a
turn costs before its text. The table then says so on its count line, naming ``--text`` or the
file; ``--json`` and ``--ids-only`` stay as they are (``"n_tokens": 0``, ``[]``).
"""

from __future__ import annotations

import argparse
import json
import sys

from ds4tui.commands.environment import print_error_json
from ds4tui.engine.gguf_model import ModelFileError
from ds4tui.engine.telemetry import plural
from ds4tui.engine.tokenizer import Tokenizer, TokenizerError, render_chat
from ds4tui.interrupts import print_whole

_PREFIX = "ds4tui tokenize: error:"


def _fail(message: str, status: int = 1, as_json: bool = False) -> int:
    """``message`` on stderr (and, for ``--json``, ``{"ok": false, "error": message}`` on stdout, as
    every command's failures are); returns ``status``."""
    print(f"{_PREFIX} {message}", file=sys.stderr)
    if as_json:
        print_error_json(message)
    return status


def _decode_utf8(raw: bytes, where: str, hint: str = "") -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TokenizerError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start}){hint}") from None


def _check_arg_text(text: str, what: str) -> str:
    """Command-line text arrives with undecodable bytes as surrogates; refuse it clearly."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TokenizerError(f"{what}: not UTF-8 text (undecodable byte at character {exc.start})") from None
    return text


#: Largest input accepted: the tokenizers library needs ~200 bytes of memory per input byte.
MAX_INPUT_BYTES = 16 << 20


def _read_limited(fh, where: str, advice: str = "tokenize it in smaller pieces", hint: str = "") -> str:
    """At most MAX_INPUT_BYTES of UTF-8 text from ``fh``; TokenizerError naming ``where`` (with
    ``advice``, what to do) for more, or for bytes that are not UTF-8 (``hint`` after the reason)."""
    raw = fh.read(MAX_INPUT_BYTES + 1)
    if len(raw) > MAX_INPUT_BYTES:
        raise TokenizerError(f"{where}: more than {MAX_INPUT_BYTES >> 20} MiB of text; {advice}")
    return _decode_utf8(raw, where, hint)


def _read_text(args: argparse.Namespace) -> str:
    """The text exactly as given: bytes are read raw (no newline translation) and decoded as UTF-8."""
    if args.text is not None:
        return _check_arg_text(args.text, "--text")
    return read_text_file(args.file, "--file", "a text file")


def read_text_file(path: str, flag: str, what: str, advice: str = "tokenize it in smaller pieces") -> str:
    """The UTF-8 text of ``path`` (``-``: standard input), at most MAX_INPUT_BYTES, read raw (no
    newline translation).  TokenizerError naming the file, and for a file that cannot be read the
    flag ``flag`` and what it expects (``what``); ``advice`` is what to do about a text too long."""
    # text in another encoding (a Windows editor's cp1252, latin-1): said with the flag and what to do
    hint = f" (argument {flag}: expected {what} in UTF-8; convert it first, e.g. iconv -f CP1252 -t UTF-8)"
    if path == "-":
        return _read_limited(sys.stdin.buffer, "<stdin>", advice, hint)
    try:
        with open(path, "rb") as fh:
            return _read_limited(fh, path, advice, hint)
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read: {exc.strerror or exc} (argument {flag}: expected {what}, "
                             f"or - for standard input; check the path)") from exc


def _visible(tokenizer: Tokenizer, token_id: int) -> str:
    """One token for the table, quoted so spaces show: backslash as \\\\, control characters as
    \\n, \\t, \\r or \\xNN, and bytes that are part of a split multi-byte character as \\xNN."""
    if tokenizer.is_added(token_id):
        text = tokenizer.token_piece(token_id)
    else:
        # A backslash byte (0x5C) never occurs inside a multi-byte UTF-8 sequence, so doubling it
        # first keeps real backslashes apart from the \\xNN escapes of stray bytes.
        raw = tokenizer.token_bytes(token_id).replace(b"\\", b"\\\\")
        text = raw.decode("utf-8", errors="backslashreplace")
    out = []
    for ch in text:
        if ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "'" + "".join(out) + "'"


def run(args: argparse.Namespace) -> int:
    """Tokenize ``--text`` / ``--file`` with the tokenizer of ``args.model``; return the exit status."""
    if args.json and args.ids_only:
        return _fail("--json and --ids-only: choose one of them, not both", 2, as_json=args.json)
    if not args.chat and (args.nothink or args.system):  # named as given: one or both
        given = [flag for flag, on in (("--system", bool(args.system)), ("--nothink", args.nothink)) if on]
        only = f"{given[0]} only applies" if len(given) == 1 else "--system and --nothink only apply"
        return _fail(f"{only} with --chat: add --chat, or leave {'it' if len(given) == 1 else 'them'} out", 2,
                     as_json=args.json)
    try:  # the text first: a file that cannot be read is named before the demo is unpacked
        text = _read_text(args)
    except TokenizerError as exc:
        return _fail(str(exc), as_json=args.json)
    if args.model is None:  # as generate and chat: the bundled demo model (its tokenizer is the real one)
        from ds4tui.demo import DemoError, demo_pair

        try:
            pair = demo_pair(None)
        except DemoError as exc:
            return _fail(str(exc), as_json=args.json)
        if pair is None:
            return _fail("no MODEL given and this build has no bundled demo model", as_json=args.json)
        for line in pair.repaired:  # a damaged file unpacked again: said on stderr
            print(f"ds4tui tokenize: note: {line}", file=sys.stderr, flush=True)
        args.model = str(pair.model)
    else:
        from ds4tui.commands.environment import check_model_path

        try:
            check_model_path(args.model)
        except ModelFileError as exc:
            return _fail(str(exc), as_json=args.json)
    try:
        tokenizer = Tokenizer.from_gguf(args.model)
        if args.chat:
            ids = render_chat(
                tokenizer,
                [{"role": "user", "content": text}],
                think=not args.nothink,
                system=_check_arg_text(args.system, "--system") or None,
            )
        else:
            ids = tokenizer.encode(text, parse_special=True)
    except (TokenizerError, ModelFileError) as exc:
        return _fail(str(exc), as_json=args.json)

    if args.ids_only:
        print("[" + ", ".join(map(str, ids)) + "]")
        return 0
    pieces = [tokenizer.token_piece(i) for i in ids]
    if args.json:
        # "bytes" (hex) is exact where a piece is only part of a multi-byte character
        raw = [tokenizer.token_bytes(i).hex() for i in ids]
        print_whole(json.dumps({"ok": True, "n_tokens": len(ids), "ids": ids, "pieces": pieces, "bytes": raw},
                               ensure_ascii=False))
        return 0
    if not ids and not text:  # an empty text: no table, and the count says why it is 0
        print(f"0 tokens: the text is empty ({_empty_source(args)})")
        return 0
    width = max([len(str(i)) for i in ids] + [2])
    print(f"{'id':>{width}}  piece")
    for token_id in ids:
        print(f"{token_id:>{width}}  {_visible(tokenizer, token_id)}")
    if args.chat and not text:  # the template's own tokens, which generate would refuse to prefill
        print(f"{plural(len(ids), 'token')}: the chat template alone, the text is empty ({_empty_source(args)})")
    else:
        print(plural(len(ids), "token"))
    return 0


def _empty_source(args: argparse.Namespace) -> str:
    """Where an empty text came from, as the command line named it."""
    if args.text is not None:
        return "--text ''"
    return "--file -: standard input gave no bytes" if args.file == "-" else f"--file {args.file}: 0 bytes"

