"""``ds4tui convert HF_DIR OUT.gguf [--types f32|f16|q8_0|q2]``.

An empty HF_DIR or OUT (an unset variable) is a usage error naming the argument, exit status 2,
before anything is read: ``Path("")`` is the current folder, which would be read or named instead."""

from __future__ import annotations

import sys
import time

from ds4tui.engine.convert import ConversionError, convert, stderr_progress


def run(args) -> int:
    for name, value, what in (("hf_dir", args.hf_dir, "the checkpoint folder to read"),
                              ("out", args.out, "the path of the .gguf file to write")):
        if not value.strip():
            print(f"ds4tui convert: error: argument {name}: expected {what}, found an empty one; give it, e.g. "
                  f"ds4tui convert HF_DIR model.gguf", file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    try:
        out = convert(args.hf_dir, args.out, types=args.types, tokenizer_json=args.tokenizer_json, name=args.name,
                      progress=None if args.quiet else stderr_progress, overwrite=args.force,
                      token_embd_q8=args.token_embd_q8)
    except (ConversionError, OSError, ValueError) as exc:
        print(f"ds4tui convert: error: {exc}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"wrote {out} ({out.stat().st_size} bytes) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(out)
    return 0
