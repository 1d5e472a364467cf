"""Put a trained demo pair into the package: ``ds4tui/demo/{model,support}.gguf.xz`` and ``demo.json``.

``python tools/pack_demo.py OUT_DIR [--drafter-run OUT2 | --earlier PREV] [--bench AB.json ...] [--eval EVAL.json] [--corpus CORPUS_DIR]``

``OUT_DIR`` is what ``tools/train_demo.py`` wrote (``model.gguf``, ``support.gguf``,
``train_log.json``).  ``--drafter-run OUT2``: a later ``train_demo.py --target-gguf OUT_DIR/model.gguf``
run whose ``support.gguf`` is shipped instead; its log becomes the ``drafter`` part of the shipped
``train_log.json`` (the first drafter's stays as ``drafter_first``, the run's settings and checks
as ``drafter_run``).  ``--earlier PREV``: ``OUT_DIR`` is a ``train_demo.py --target-init`` run that
continued a packed pair, and ``PREV`` holds a copy of that pair's ``demo.json`` and ``train_log.json``
(copied out of ``ds4tui/demo/`` before packing over them); the run must have started from exactly
those files (sha256), and the earlier log is kept whole at the end of ``earlier_runs``.  Both GGUFs are validated (target layout, support compatible with the target),
compressed with xz (preset 6; the unseen-token rows that training kept identical make the
model file compress to about a third of its size, the support file to about a half) and described in ``demo.json``: sizes and sha256 of the
uncompressed files (``ds4tui.demo`` checks them when it unpacks), the corpus manifest, the training
summary, the ``ds4tui bench --ab`` results given with ``--bench``, the ``tools/eval_demo.py`` result
given with ``--eval`` (without the answers' text) and, with ``--corpus``, the held-out perplexity of
the q2 GGUF measured with the native engine.  The full ``train_log.json`` is copied next to them,
and ``corpus_sources.json`` lists every source of the training text with its version, licence and
origin (the corpus manifest's ``sources``).
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

from ds4tui.demo import PACKAGE_DIR, file_sha256
from ds4tui.engine.gguf_model import DS4Model, SupportModel


def bench_summary(path: Path) -> dict:
    """Per arm and prompt kind (from ``ds4tui bench --ab --out`` JSON): tokens/s and its ratio to
    target-only, accept rate, accepted drafts and tokens per cycle, per-position acceptance, and
    verify / target decode ms."""
    data = json.loads(path.read_text())
    arms = {}
    for arm in data["arms"]:
        runs = {}
        for r in arm["runs"]:
            st = r.get("dspark_stats", {})
            runs[r["kind"]] = {
                "tokens_per_s": round(r["tokens_per_s"], 2), "ratio_to_target": round(r["ratio_to_target"], 3),
                "accept_rate": None if r["accept_rate"] is None else round(r["accept_rate"], 2), "avg_accept": round(st.get("avg_accept", 0.0), 3),
                "tokens_per_cycle": round(r["tokens_per_cycle"], 3), "cycles": st.get("cycles"),
                "per_position_accept": [None if x is None else round(x, 3) for x in st.get("per_position_accept", [])],
                "verify_ms_per_drafted_cycle": _round(r["stage_timing"]["verify_ms_per_drafted_cycle"]),
                "t_decode_ms": round(st.get("t_decode_ms", 0.0), 3)}
        arms[arm["name"]] = {"knobs": arm["knobs"], "runs": runs}
    return {"backend": data["backend"], "threads": data["n_threads"], "tokens": data["tokens"],
            "outputs_identical": data["outputs_identical"], "arms": arms}


def merge_drafter_run(log: dict, run: dict, model_sha256: str) -> dict:
    """The training log of a pair whose drafter came from a later, drafter-only run.

    The first drafter (trained with the target) stays as ``drafter_first`` / ``distill_first``; when
    ``log`` already ships a drafter-only run's drafter, that one moves to the end of
    ``drafter_earlier`` (its ``drafter``, ``distill``, ``drafter_run`` and heal entries), so a chain of
    runs keeps every step.  The run's ``drafter_heal`` (routed experts frozen at their q2 bytes) and
    ``drafter_exported`` (statistics of the written file) come along when it has them.  Raises
    ValueError when that run trained against another model file than ``model_sha256``."""
    got = run.get("target_from_gguf", {}).get("sha256")
    if got != model_sha256:
        raise ValueError(f"the drafter run trained against a model with sha256 {got}, not this model.gguf "
                         f"({model_sha256}); pass the run made with --target-gguf on this file")
    out = dict(log)
    if "drafter_run" in log:
        earlier = {k: log[k] for k in DRAFTER_RUN_KEYS if k in log}
        out["drafter_earlier"] = [*log.get("drafter_earlier", []), earlier]
    else:
        out["drafter_first"], out["distill_first"] = log["drafter"], log.get("distill")
    for k in DRAFTER_RUN_KEYS[:-1]:
        out.pop(k, None)
        if k in run:
            out[k] = run[k]
    out["check"] = {**{k: v for k, v in log["check"].items() if not k.startswith("drafter_")}, **run["check"]}
    out["drafter_run"] = {k: run[k] for k in ("args", "device", "versions", "target_from_gguf", "drafter_init",
                                              "export", "total_seconds") if k in run}
    out["total_seconds"] = round(log["total_seconds"] + run["total_seconds"], 1)
    return out


def keep_earlier_runs(log: dict, earlier_log: dict, earlier_demo: dict) -> dict:
    """The training log of a pair whose target continued an earlier packed pair (``--target-init``).

    ``earlier_log`` / ``earlier_demo`` are that pair's ``train_log.json`` and ``demo.json``.  Its whole
    log (less its own ``earlier_runs``), with the sizes and sha256 of its files and its measurements
    (``eval`` without the per-prompt rows, held-out perplexity), goes to the end of the new log's
    ``earlier_runs``, after the runs it kept, so a chain of runs keeps every step.  Raises ValueError
    when the run did not start from that pair's model (``target_init``) and drafter (``drafter_init``,
    when it had one)."""
    files = earlier_demo["files"]
    init = log.get("target_init")
    if init is None:
        raise ValueError("this train_log.json has no target_init: --earlier is for a run made with "
                         "train_demo.py --target-init (a drafter-only run takes --drafter-run)")
    for key, name in (("target_init", "model.gguf"), ("drafter_init", "support.gguf")):
        if key in log and log[key].get("sha256") != files[name]["sha256"]:
            raise ValueError(f"the run's {key} has sha256 {log[key].get('sha256')}, not the earlier pair's "
                             f"{name} ({files[name]['sha256']}); pass the demo.json and train_log.json of "
                             "the pair the run started from")
    measured = {"heldout_perplexity_gguf": earlier_demo.get("heldout_perplexity_gguf")}
    if "eval" in earlier_demo:
        measured["eval"] = {**earlier_demo["eval"], "function_prompts": {
            k: v for k, v in earlier_demo["eval"]["function_prompts"].items() if k != "per_prompt"}}
    entry = {"files": files, "measured": measured, **{k: v for k, v in earlier_log.items() if k != "earlier_runs"}}
    return {**log, "earlier_runs": [*earlier_log.get("earlier_runs", []), entry]}


DRAFTER_RUN_KEYS = ("drafter", "distill", "drafter_heal", "drafter_exported", "drafter_run")
"""What a drafter-only run contributes to the shipped log (``drafter_run`` last: its settings)."""


def _stats(d: dict | None, keys=("steps", "seconds", "heldout", "heldout_generated")) -> dict | None:
    return None if d is None else {k: d[k] for k in keys if k in d}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def heldout_perplexity(model: Path, tokens: np.ndarray, windows: int = 8, length: int = 512) -> dict:
    """Perplexity of ``model`` (native CPU engine, ds4 numerics) on ``windows`` evenly spaced
    ``length``-token windows of the held-out split: every position's next-token log-likelihood."""
    from ds4tui.engine.session import Engine

    nll = []
    with Engine(model) as engine:
        for start in np.linspace(0, tokens.size - length - 1, windows).astype(int):
            ids = tokens[start:start + length + 1].tolist()
            session = engine.session(n_ctx=length + 8)
            logits = session.prefill(ids[:-1], logits="all").astype(np.float64)
            session.close()
            top = logits.max(-1)
            lse = top + np.log(np.exp(logits - top[:, None]).sum(-1))
            nll.append(lse - logits[np.arange(length), ids[1:]])
    mean = float(np.concatenate(nll).mean())
    return {"tokens": windows * length, "mean_nll": round(mean, 4), "perplexity": round(math.exp(mean), 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the folder tools/train_demo.py wrote")
    ap.add_argument("--drafter-run", type=Path, help="a train_demo.py --target-gguf output folder: ship its drafter")
    ap.add_argument("--earlier", type=Path, help="a folder with the demo.json and train_log.json of the pair a "
                    "train_demo.py --target-init run continued: keep its log under earlier_runs")
    ap.add_argument("--bench", type=Path, nargs="*", default=[], help="ds4tui bench --ab --out JSON files to record")
    ap.add_argument("--eval", type=Path, help="tools/eval_demo.py --out JSON to record")
    ap.add_argument("--corpus", type=Path, help="tools/demo_corpus.py folder: measure held-out perplexity of the GGUF")
    ap.add_argument("--draft-vocab", type=int, default=16384, metavar="N",
                    help="with --corpus: write the N most frequent tokens of its train split into the shipped "
                    "support file as its draft vocabulary (tools/demo_draft_vocab.py; 0: none). Default 16384")
    a = ap.parse_args(argv)
    model, support = a.out / "model.gguf", a.out / "support.gguf"
    target = DS4Model(model)
    log = json.loads((a.out / "train_log.json").read_text())
    if a.drafter_run:
        support = a.drafter_run / "support.gguf"
        log = merge_drafter_run(log, json.loads((a.drafter_run / "train_log.json").read_text()),
                                file_sha256(model))
    if a.earlier:
        if a.drafter_run:
            ap.error("--drafter-run and --earlier: pack one kind of run at a time")
        log = keep_earlier_runs(log, json.loads((a.earlier / "train_log.json").read_text()),
                                json.loads((a.earlier / "demo.json").read_text()))
    SupportModel(support, target.config).require_compatible()
    vocab_record = None
    if a.corpus and a.draft_vocab > 0:  # the shipped support file carries its draft vocabulary (spec dspark.md §2.6)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from demo_draft_vocab import add_to_support

        listed = Path(tempfile.mkdtemp(prefix="pack_demo.")) / "support.gguf"  # the training output stays as it is
        vocab_record = add_to_support(support, listed, model, a.corpus, a.draft_vocab)
        support = listed
    files = {}
    for path in (model, support):
        files[path.name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
        dest = PACKAGE_DIR / (path.name + ".xz")
        with open(path, "rb") as src, lzma.open(dest, "wb", preset=6) as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
        files[path.name]["xz_bytes"] = dest.stat().st_size
        print(f"pack_demo: {dest} ({files[path.name]['xz_bytes'] / 2**20:.1f} MiB from "
              f"{files[path.name]['bytes'] / 2**20:.1f} MiB)", file=sys.stderr)
    summary = {
        "files": files,
        "corpus": log["corpus"],
        "training": {
            "device": log["device"], "versions": log["versions"], "seed": log["seed"],
            "target_parameters": log["target_parameters"],
            "target_init": ({k: log["target_init"][k] for k in ("path", "sha256", "heldout_loss",
                                                                 "max_abs_logit_diff_vs_reference")}
                            if "target_init" in log else None),
            "target": {k: log["target"][k] for k in ("steps", "tokens", "seconds", "heldout_loss")},
            "expert_quant_rel_error": log["expert_quant_rel_error"],
            "heal": {k: log["heal"][k] for k in ("steps", "tokens", "seconds", "heldout_loss")},
            "distill": log.get("distill"),
            "drafter": {k: log["drafter"][k] for k in ("steps", "seconds", "heldout", "heldout_generated",
                                                       "capture_layers", "loss") if k in log["drafter"]},
            "drafter_heal": _stats(log.get("drafter_heal"), ("experts_from", "experts_bytes_equal", "steps", "seconds",
                                                             "after_freezing", "heldout", "heldout_generated")),
            "drafter_exported": log.get("drafter_exported"),
            "drafter_first": _stats(log.get("drafter_first")),
            "drafter_earlier": [_stats(e["drafter"]) for e in log.get("drafter_earlier", [])] or None,
            "drafter_run": {k: log["drafter_run"][k] for k in ("target_from_gguf", "drafter_init", "total_seconds")
                            if k in log["drafter_run"]} if "drafter_run" in log else None,
            "check": log["check"],
            "earlier_runs": [{"model_sha256": e["files"]["model.gguf"]["sha256"],
                              "support_sha256": e["files"]["support.gguf"]["sha256"],
                              "target": {k: e["target"][k] for k in ("steps", "tokens", "seconds", "heldout_loss")},
                              "total_seconds": e["total_seconds"]}
                             for e in log.get("earlier_runs", [])] or None,
        },
        "bench": {p.name: bench_summary(p) for p in a.bench},
    }
    summary["corpus"] = {k: v for k, v in log["corpus"].items() if k != "sources"}
    if vocab_record is not None:
        summary["draft_vocab"] = vocab_record
    if a.eval:
        ev = json.loads(a.eval.read_text())
        fp = ev["function_prompts"]
        summary["eval"] = {**{k: v for k, v in ev.items() if k not in ("function_prompts", "model", "support")},
                           "function_prompts": {**{k: v for k, v in fp.items() if k != "answers"},
                                                "per_prompt": [{k: x[k] for k in ("prompt", "tokens", "fenced", "parses",
                                                                                   "compiles", "statements", "repeats", "ok") if k in x}
                                                               for x in fp["answers"]]}}
    if a.corpus:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from demo_corpus import load_split

        summary["heldout_perplexity_gguf"] = heldout_perplexity(model, load_split(a.corpus, "heldout"))
        print(f"pack_demo: held-out perplexity {summary['heldout_perplexity_gguf']}", file=sys.stderr)
    (PACKAGE_DIR / "demo.json").write_text(json.dumps(summary, indent=1) + "\n")
    (PACKAGE_DIR / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    sources = {"note": "every source of the demo model's training text (tools/demo_corpus.py); all permissive",
               "sources": log["corpus"].get("sources", [{"package": "python-stdlib", "version": log["corpus"].get("python"),
                                                         "licence": log["corpus"].get("licence")}])}
    (PACKAGE_DIR / "corpus_sources.json").write_text(json.dumps(sources, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
