"""Give the packed demo pair a draft vocabulary (spec dspark.md §2.6), from its training corpus.

``python tools/demo_draft_vocab.py CORPUS_DIR [--size 16384]``

``CORPUS_DIR`` is the ``tools/demo_corpus.py`` folder the pair was trained on (its manifest's
``listing_sha256`` must equal the one in ``ds4tui/demo/demo.json``).  The tokens of its *train*
split are counted and ranked (ties: the lower id first) after the chat template's own tokens, the
first ``--size`` are written into ``ds4tui/demo/support.gguf.xz`` under ``ds4tui.draft_vocab``
(every other byte of the support file unchanged), and ``demo.json`` records the support file's new
size and sha256 and, under ``draft_vocab``, the list's size, its source and the share of the
held-out split's tokens it covers.  The model file is not touched.  ``tools/pack_demo.py
--draft-vocab N --corpus DIR`` does the same when it packs a newly trained pair.
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_corpus import load_split  # noqa: E402

from ds4tui.commands.draft_vocab import template_ids  # noqa: E402
from ds4tui.demo import PACKAGE_DIR, file_sha256  # noqa: E402
from ds4tui.engine import draft_vocab as DV  # noqa: E402
from ds4tui.engine.gguf_model import DS4Model  # noqa: E402
from ds4tui.engine.tokenizer import Tokenizer  # noqa: E402


def corpus_list(model: Path, corpus: Path, size: int) -> tuple[list[int], dict]:
    """The first ``size`` tokens of the corpus's train split by count, after the chat template's
    tokens, and the record ``demo.json`` keeps of them."""
    target = DS4Model(model)
    n_vocab = target.config.n_vocab
    train, held = load_split(corpus, "train"), load_split(corpus, "heldout")
    always = template_ids(Tokenizer.from_gguf(target.reader))
    ranked = DV.rank_tokens([train], n_vocab, always=always)
    keep = ranked[:size]
    listed = np.zeros(n_vocab, bool)
    listed[np.asarray(keep, dtype=np.int64)] = True
    record = {"size": len(keep), "of": n_vocab, "key": DV.KEY, "distinct_in_train": len(ranked),
              "source": "token counts of the corpus's train split, the chat template's tokens first",
              "heldout_coverage": round(float(listed[held.astype(np.int64)].mean()), 6)}
    return keep, record


def add_to_support(support: Path, out: Path, model: Path, corpus: Path, size: int) -> dict:
    """Write ``support`` with the corpus's list to ``out``; the record for ``demo.json``."""
    keep, record = corpus_list(model, corpus, size)
    DV.write_list(support, out, keep, n_vocab=DS4Model(model).config.n_vocab)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", type=Path, help="the tools/demo_corpus.py folder the pair was trained on")
    ap.add_argument("--size", type=int, default=16384, help="tokens in the list (default 16384)")
    a = ap.parse_args(argv)
    demo = json.loads((PACKAGE_DIR / "demo.json").read_text())
    manifest = json.loads((a.corpus / "manifest.json").read_text())
    if manifest.get("listing_sha256") != demo["corpus"].get("listing_sha256"):
        raise SystemExit(f"demo_draft_vocab: {a.corpus} is not the corpus the demo pair was trained on "
                         f"(listing_sha256 {manifest.get('listing_sha256')}, demo.json has "
                         f"{demo['corpus'].get('listing_sha256')})")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        for name in ("model.gguf", "support.gguf"):
            with lzma.open(PACKAGE_DIR / (name + ".xz")) as src, open(t / name, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            if file_sha256(t / name) != demo["files"][name]["sha256"]:
                raise SystemExit(f"demo_draft_vocab: {name}.xz does not unpack to the sha256 in demo.json")
        record = add_to_support(t / "support.gguf", t / "support_vd.gguf", t / "model.gguf", a.corpus, a.size)
        new = t / "support_vd.gguf"
        dest = PACKAGE_DIR / "support.gguf.xz"
        with open(new, "rb") as src, lzma.open(dest, "wb", preset=6) as out:
            shutil.copyfileobj(src, out, 1 << 20)
        demo["files"]["support.gguf"] = {"bytes": new.stat().st_size, "sha256": file_sha256(new),
                                         "xz_bytes": dest.stat().st_size}
    demo["draft_vocab"] = record
    (PACKAGE_DIR / "demo.json").write_text(json.dumps(demo, indent=1) + "\n")
    print(f"demo_draft_vocab: {dest}: {record['size']} tokens, {100 * record['heldout_coverage']:.2f} % of the "
          f"held-out tokens", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
