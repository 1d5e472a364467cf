"""Greedy continuations of demo training prompts, made by ds4tui's own engine on the CPU, in the file
format ``tools/train_demo.py --continuations`` trains a drafter on.

``python tools/engine_continuations.py MODEL CORPUS_DIR OUT.npz.xz [--sequences 8192] [--seed 101]
[--workers 2] [--threads 1] [--support SUPPORT] [--activations f32] [--save-every 256]``

Why: a drafter learns to predict the target's greedy continuations.  ``train_demo.py`` makes them on
the training GPU with transformers under bf16 autocast, where a near tie can resolve otherwise than in
the engine that runs the pair; these are the engine's own picks (``--activations f32``, the reference
numerics and what ``tools/eval_demo.py`` measures with, or ``q8``, the CPU default of the CLI), and
they cost no device time.

What it does: ``--sequences`` windows of ``--prompt-tokens`` tokens drawn from the corpus's training
split (``tools/demo_corpus.py``; a numpy generator seeded with ``--seed``, which the file records, so
two files of one target must have different seeds: ``demo_corpus.load_continuations`` refuses the same
prompts twice), each continued greedily for ``--new-tokens`` tokens by the target MODEL, with DSpark
when ``--support`` is given (scheduler off: greedy DSpark emits exactly the target's own picks, only
faster).  ``--workers`` processes of ``--threads`` threads each share the windows.  The file
(``demo_corpus.save_continuations``: ids, MODEL's sha256, the lengths, the seed) is rewritten every
``--save-every`` sequences and at the end, so an interrupted run (Ctrl-C, or SIGTERM) keeps what it made.
Progress (sequences, rate, time left) goes to stderr.

Exit status: 0 done, 1 the engine failed (a damaged GGUF: its message; the file holds the sequences made
before), 2 a usage error (a missing file, a bad number), 130 interrupted by Ctrl-C or 143 stopped by
SIGTERM (the file holds the sequences made so far).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

_ENGINE = None  # a worker's engine (one per process)
_INIT_ERROR: str | None = None  # why it could not be made (raised by the worker's first job, not by the pool's
                                # initializer, after which multiprocessing would start workers forever)


def prompts(train: np.ndarray, n: int, length: int, seed: int) -> np.ndarray:
    """``n`` windows of ``length`` tokens of ``train`` at starts drawn uniformly by
    ``numpy.random.default_rng(seed)``: int64 ``[n, length]``."""
    if train.size <= length:
        raise ValueError(f"the training split holds {train.size} tokens, fewer than a {length}-token prompt needs")
    start = np.random.default_rng(seed).integers(0, train.size - length, size=n)
    return train[start[:, None] + np.arange(length)[None, :]].astype(np.int64)


def _init(model: str, support: str | None, threads: int, activations: str) -> None:
    global _ENGINE, _INIT_ERROR
    try:
        from ds4tui.engine.session import Engine

        _ENGINE = Engine(model, backend="cpu", n_threads=threads, support=support, activations=activations)
    except Exception as exc:  # noqa: BLE001 - reported by _work, with its message
        _INIT_ERROR = f"{type(exc).__name__}: {exc}"


def continue_greedy(engine, prompt: list[int], n_new: int) -> list[int]:
    """``prompt`` followed by ``engine``'s ``n_new`` greedy tokens (no stop at EOS; with a support model
    attached, by greedy DSpark with the scheduler off, which emits the same tokens)."""
    with engine.session(n_ctx=len(prompt) + n_new + 16, scheduler=False) as s:
        out = list(s.generate(prompt, max_tokens=n_new))
    if len(out) != n_new:
        raise RuntimeError(f"the engine emitted {len(out)} tokens, {n_new} were asked for")
    return list(prompt) + out


def _work(job: tuple[int, np.ndarray, int]) -> tuple[int, np.ndarray]:
    first, rows, n_new = job
    if _ENGINE is None:
        raise RuntimeError(f"the engine could not be opened: {_INIT_ERROR}")
    return first, np.array([continue_greedy(_ENGINE, [int(t) for t in r], n_new) for r in rows],
                           dtype=np.int64)


def main(argv: list[str] | None = None) -> int:
    from demo_corpus import load_split, save_continuations

    from ds4tui.demo import file_sha256

    ap = argparse.ArgumentParser(prog="engine_continuations.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path, help="the target GGUF (the drafter will be trained against it)")
    ap.add_argument("corpus", type=Path, help="tools/demo_corpus.py folder (its training split)")
    ap.add_argument("out", type=Path, help="the continuations file to write (.npz.xz)")
    ap.add_argument("--sequences", type=int, default=8192, help="windows to continue (default 8192)")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="tokens a prompt (train_demo's --distill-prompt)")
    ap.add_argument("--new-tokens", type=int, default=96, help="greedy tokens a prompt (train_demo's --distill-new)")
    ap.add_argument("--seed", type=int, default=101, help="seed of the prompts' starts (recorded in the file)")
    ap.add_argument("--support", type=Path, default=None,
                    help="a DSpark support GGUF for speed (greedy DSpark emits the target's own picks)")
    ap.add_argument("--workers", type=int, default=max(1, min(os.cpu_count() or 1, 2)), help="processes")
    ap.add_argument("--threads", type=int, default=1, help="threads a process")
    ap.add_argument("--activations", choices=("f32", "q8"), default="f32",
                    help="the engine's matmul activations (f32: the reference numerics, as tools/eval_demo.py)")
    ap.add_argument("--save-every", type=int, default=256, help="rewrite the file after this many more sequences")
    a = ap.parse_args(argv)
    for name, v, lo in (("--sequences", a.sequences, 1), ("--prompt-tokens", a.prompt_tokens, 1),
                        ("--new-tokens", a.new_tokens, 1), ("--workers", a.workers, 1), ("--threads", a.threads, 1),
                        ("--save-every", a.save_every, 1), ("--seed", a.seed, 0)):
        if v < lo:
            ap.error(f"{name} must be >= {lo}, got {v}")
    for flag, p in (("MODEL", a.model), ("--support", a.support)):
        if p is not None and not p.is_file():
            ap.error(f"{flag} {p}: no such file")
    if not a.out.parent.is_dir():
        ap.error(f"OUT {a.out}: its folder {a.out.parent} does not exist")
    try:
        train = load_split(a.corpus, "train")
        rows = prompts(train, a.sequences, a.prompt_tokens, a.seed)
    except (FileNotFoundError, ValueError) as exc:
        ap.error(f"CORPUS_DIR {a.corpus}: {exc}")
    sha = file_sha256(a.model)
    chunk = 8
    jobs = [(i, rows[i:i + chunk], a.new_tokens) for i in range(0, a.sequences, chunk)]
    done: list[np.ndarray] = []
    made = saved = 0
    t0 = time.time()

    def save() -> None:
        nonlocal saved
        if made > saved:
            save_continuations(a.out, np.concatenate(done), target_sha256=sha, prompt_tokens=a.prompt_tokens,
                               new_tokens=a.new_tokens, seed=a.seed)
            saved = made

    print(f"engine_continuations: {a.sequences} windows of {a.prompt_tokens} + {a.new_tokens} tokens, "
          f"{a.workers} worker(s) x {a.threads} thread(s), activations {a.activations}"
          + (", DSpark" if a.support else "") + f" -> {a.out}", file=sys.stderr, flush=True)
    stopped_by = []

    def on_term(signum, frame):  # a `kill` (SIGTERM) stops the run as Ctrl-C does: what was made is kept
        stopped_by.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    ctx = mp.get_context("spawn")
    pool = ctx.Pool(a.workers, _init, (str(a.model), str(a.support) if a.support else None, a.threads, a.activations))
    try:
        for first, ids in pool.imap(_work, jobs):  # in order: the file holds a prefix of the windows
            done.append(ids)
            made += ids.shape[0]
            if made - saved >= a.save_every:
                save()
            el = time.time() - t0
            print(f"\r{made}/{a.sequences} sequences, {made / el:.1f}/s, {(a.sequences - made) * el / made:.0f} s left ",
                  end="", file=sys.stderr, flush=True)
        pool.close()
    except KeyboardInterrupt:
        pool.terminate()
        save()
        print(f"\ninterrupted: {a.out} holds the first {saved} sequences", file=sys.stderr)
        return 143 if stopped_by else 130
    except Exception as exc:  # noqa: BLE001 - a worker's error, with what was made kept
        pool.terminate()
        save()
        print(f"\nengine_continuations: {exc}" + (f" ({a.out} holds the first {saved} sequences)" if saved else ""),
              file=sys.stderr)
        return 1
    finally:
        pool.join()
    save()
    print(f"\n{a.out}: {saved} sequences in {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
