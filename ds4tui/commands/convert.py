"""``ds4tui convert HF_DIR OUT.gguf [--types f32|f16|q8_0|q2]``."""

from __future__ import annotations

import sys
import time

from ds4tui.engine.convert import ConversionError, convert, stderr_progress


def run(args) -> int:
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
