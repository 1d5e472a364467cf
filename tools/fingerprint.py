"""Fingerprints of the native engine's numbers, to prove a refactor changes no bit.

``python tools/fingerprint.py [--out FILE] [--backend cpu|hip] [--models DIR]`` builds (once, into
``--models``, default ``models/fingerprint``) the tiny test model in the q2 and the F32 mix with
its fitted DSpark support file, then prints one sha256 per check:

- ``<mix>/<numerics>/prefill``: the logits of every position of a 40-token prompt (one pass), and
  of the same prompt in chunks of 7 (positions cross chunk and compressor-window boundaries);
- ``<mix>/<numerics>/decode``: 48 greedy tokens and the last logits row after them;
- ``q2/ds4/dspark``: greedy DSpark decoding of 64 tokens with the scheduler off: the ids, the
  draft-length and accepted-length histograms and every counter of the stats struct that is not a
  time;
- ``demo/dspark`` (when the bundled demo pair is present): the same on the demo pair;
- on the CPU, ``q2/ds4/q8/...`` and ``demo/q8/dspark``: the same with 8-bit activations
  (spec ds4.md §2.9.5).

Two runs print the same lines if and only if the engine computes the same floats (hashes are over
the raw float32 bytes).  The JSON written with ``--out`` holds the same map.  Not a test: CI never
runs it; it is the before/after record of a change that must not move a bit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np


def _h(*arrays) -> str:
    m = hashlib.sha256()
    for a in arrays:
        m.update(np.ascontiguousarray(a).tobytes())
    return m.hexdigest()[:16]


def _models(root: Path) -> dict:
    from ds4tui.devtools import make_test_model as mtm
    from ds4tui.devtools.fit_support import fit_support

    out = {}
    for mix in ("q2", "f32"):
        d = root / mix
        if not (d / "model.gguf").exists():
            mtm.make(d, config="tiny", seed=0, types=mix)
        out[mix] = {"model": d / "model.gguf", "support": d / "support.gguf"}
    fitted = root / "q2" / "fitted.gguf"
    if not fitted.exists():
        fit_support(out["q2"]["model"], out["q2"]["support"], fitted, prompts=6, tokens=24, scan=4096, seed=0)
    out["q2"]["fitted"] = fitted
    return out


PROMPT = [(i * 7919 + 13) % 120000 + 100 for i in range(40)]


def _dspark(eng, prompt, n=64) -> str:
    from ds4tui.engine.session import SamplingParams

    s = eng.session(512, n_batch=32)
    s.set_sampling(SamplingParams(temperature=0.0))
    s.set_dspark(enabled=True, scheduler=False)
    ids = list(s.generate(prompt, max_tokens=n))
    st = s.dspark_stats()
    counters = {k: v for k, v in st.to_dict().items() if not k.endswith("_ms") and "ms" not in k
                and not isinstance(v, (float, dict))}
    s.close()
    return _h(np.array(ids, np.int64), np.frombuffer(json.dumps(counters, sort_keys=True).encode(), np.uint8))


def run(root: Path, backend: str) -> dict:
    from ds4tui.engine.session import Engine, SamplingParams

    m = _models(root)
    res = {}
    runs = [(mix, numerics, "f32") for mix in ("q2", "f32") for numerics in ("ds4", "transformers")]
    if backend == "cpu":
        runs.append(("q2", "ds4", "q8"))  # 8-bit activations (spec ds4.md §2.9.5): a CPU option
    for mix, numerics, act in runs:
        tag = f"{mix}/{numerics}" + ("" if act == "f32" else f"/{act}")
        with Engine(m[mix]["model"], backend=backend, numerics=numerics,
                    **({} if act == "f32" else {"activations": act})) as eng:
            s = eng.session(512, n_batch=64)
            whole = s.prefill(PROMPT, logits="all")
            s.reset()
            parts = [s.prefill(PROMPT[i:i + 7], logits="all") for i in range(0, len(PROMPT), 7)]
            res[f"{tag}/prefill"] = _h(whole, np.concatenate(parts))
            s.reset()
            s.set_sampling(SamplingParams(temperature=0.0))
            ids = list(s.generate(PROMPT, max_tokens=48))
            last = s.prefill([ids[-1]], logits="last")
            res[f"{tag}/decode"] = _h(np.array(ids, np.int64), last)
            s.close()
    with Engine(m["q2"]["model"], support=m["q2"]["fitted"], backend=backend) as eng:
        res["q2/ds4/dspark"] = _dspark(eng, PROMPT)
    try:
        from ds4tui import demo

        pair = demo.demo_pair()
    except Exception as exc:  # the demo pair is optional here
        print(f"demo pair not available: {exc}", file=sys.stderr)
        pair = None
    if pair:
        with Engine(pair.model, support=pair.support, backend=backend) as eng:
            res["demo/dspark"] = _dspark(eng, PROMPT[:24])
        if backend == "cpu":
            with Engine(pair.model, support=pair.support, backend=backend, activations="q8") as eng:
                res["demo/q8/dspark"] = _dspark(eng, PROMPT[:24])
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--backend", default="cpu", choices=("cpu", "hip"))
    ap.add_argument("--models", type=Path, default=Path("models/fingerprint"))
    a = ap.parse_args(argv)
    res = run(a.models, a.backend)
    for k, v in res.items():
        print(f"{k:28s} {v}")
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
