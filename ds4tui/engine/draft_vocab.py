"""The draft vocabulary: the tokens DSpark's drafter proposes from (spec dspark.md §2.6).

The drafter's last two steps, the target's LM head over its hidden rows and the Markov head's
correction, produce a logit for every token of the vocabulary (129280 for DS4) and take the
argmax.  On a small model those two products over the whole vocabulary are most of a proposal's
time (the bundled demo pair on 2 CPU threads: 2.2 of 3.3 ms).  A draft vocabulary restricts both to
a list of token ids, the most frequent tokens of the text the drafter is meant for, so they read
and compute only those rows.  The output cannot change: every draft is still verified by the
target, which scores the whole vocabulary; a token outside the list can only be missed as a draft
(it then costs acceptance, never correctness).  This is the frequency-ranked draft vocabulary of
FR-Spec (Zhao et al., 2025, arXiv:2502.14856) and of EAGLE-3's reduced draft vocabulary.

Where the list comes from: a support GGUF may carry one under the metadata key :data:`KEY` (an
array of token ids, most frequent first; written by ``ds4tui draft-vocab``).  The engine option
``draft_vocab`` chooses:

* ``"auto"`` (the default): the file's list when it has one, else the whole vocabulary;
* ``"full"``: the whole vocabulary, whatever the file holds;
* ``N`` (an int >= 1): the first ``N`` ids of the file's list (an error when the file has none, or
  fewer than ``N``);
* a sequence of token ids (the Python API, for experiments and tests).
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from ds4tui.engine.errors import DraftVocabError

if TYPE_CHECKING:  # pragma: no cover
    from ds4tui.engine.gguf_model import SupportModel

#: the support GGUF's metadata key of the ranked draft vocabulary (a ds4tui extension: ds4 and
#: llama.cpp ignore keys they do not know)
KEY = "ds4tui.draft_vocab"

#: the choices of ``--draft-vocab`` besides a count
MODES = ("auto", "full")

__all__ = ["DraftVocabError", "KEY", "MODES", "check_draft_vocab", "file_list", "resolve", "rank_tokens",
           "write_list", "list_problem"]


def check_draft_vocab(value) -> "str | int | tuple[int, ...]":
    """``value`` as the engine keeps it: ``"auto"``, ``"full"``, a count ``N >= 1`` or a tuple of
    token ids.  Raises :class:`DraftVocabError` for anything else."""
    if isinstance(value, str):
        if value in MODES:
            return value
        if value.isdigit():
            value = int(value)
        else:
            raise DraftVocabError(f"expected auto, full or a count >= 1, found {value!r}")
    if isinstance(value, (bool, np.bool_)):
        raise DraftVocabError(f"expected auto, full or a count >= 1, found {value!r}")
    if isinstance(value, (int, np.integer)):
        if value < 1:
            raise DraftVocabError(f"a count must be >= 1 (full for the whole vocabulary), found {value}")
        return int(value)
    try:
        ids = tuple(int(i) for i in value)
    except (TypeError, ValueError):
        raise DraftVocabError(f"expected auto, full, a count or token ids, found {value!r}") from None
    if not ids:
        raise DraftVocabError("an empty list of token ids (use full for the whole vocabulary)")
    return ids


def file_list(support: "SupportModel") -> "tuple[list[int] | None, str]":
    """The support file's ranked list (``None`` when it has none or it cannot be used) and, when it
    cannot be used, why."""
    from ds4tui.engine.gguf_model import field_value

    f = support.reader.fields.get(KEY)
    if f is None:
        return None, ""
    try:
        ids = [int(i) for i in field_value(f)]
    except (TypeError, ValueError):
        return None, f"{support.path}: metadata key '{KEY}' is not an array of token ids"
    return ids, ""


def list_problem(ids: Sequence[int], n_vocab: int) -> str:
    """Why ``ids`` cannot be a draft vocabulary of ``n_vocab`` tokens (an id outside it, an id twice); "" when it can."""
    bad = next((i for i in ids if not 0 <= i < n_vocab), None)
    if bad is not None:
        return f"token id {bad} is outside the vocabulary 0..{n_vocab - 1}"
    seen: set[int] = set()
    for i in ids:
        if i in seen:
            return f"token id {i} is listed twice"
        seen.add(i)
    return ""


def resolve(wanted, support: "SupportModel", n_vocab: int) -> "tuple[list[int], str]":
    """The ids to draft from (``[]``: the whole vocabulary) and a note that says which and why, the
    same on every backend.

    Raises :class:`DraftVocabError` when an explicit choice cannot be met (a count without a list in
    the file, a count beyond it, ids outside the vocabulary or listed twice)."""
    full = f"full: all {n_vocab} tokens"
    if wanted == "full":
        return [], full
    if isinstance(wanted, tuple):
        why = list_problem(wanted, n_vocab)
        if why:
            raise DraftVocabError(why)
        return list(wanted), f"{len(wanted)} of {n_vocab} tokens (given as ids)"
    ids, why = file_list(support)
    if ids is not None:
        why = list_problem(ids, n_vocab)
        if why:
            ids, why = None, f"{support.path}: metadata key '{KEY}': {why}"
    if wanted == "auto":
        if ids is None:
            return [], full + (f" ({why}; ignored)" if why else " (the support file has no draft vocabulary)")
        return ids, f"auto: {len(ids)} of {n_vocab} tokens, the support file's list"
    if ids is None:
        raise DraftVocabError(f"{wanted}: " + (why or f"{support.path} has no draft vocabulary (metadata key "
                              f"'{KEY}'); `ds4tui draft-vocab` adds one, or choose full or auto"))
    if wanted > len(ids):
        raise DraftVocabError(f"{wanted}: {support.path} lists {len(ids)} tokens; choose at most {len(ids)}, "
                              f"or full for the whole vocabulary")
    return ids[:wanted], f"{wanted} of {n_vocab} tokens, the first of the support file's list of {len(ids)}"


def rank_tokens(token_lists: Iterable[Sequence[int]], n_vocab: int, always: Iterable[int] = ()) -> list[int]:
    """Token ids by falling count over ``token_lists`` (ties: the lower id first), ids in ``always``
    first (the chat template's and end-of-text tokens, which plain text rarely holds); only ids
    that occur (or are in ``always``)."""
    counts = np.zeros(n_vocab, np.int64)
    for ids in token_lists:
        a = np.asarray(ids, dtype=np.int64)
        if a.size:
            if a.min() < 0 or a.max() >= n_vocab:
                raise DraftVocabError(f"token id outside 0..{n_vocab - 1}", "rank_tokens")
            counts += np.bincount(a, minlength=n_vocab)
    first = list(collections.OrderedDict.fromkeys(int(i) for i in always))
    order = np.lexsort((np.arange(n_vocab), -counts))
    rest = [int(i) for i in order if counts[i] > 0 and int(i) not in set(first)]
    return first + rest


def write_list(src: "str | Path", dst: "str | Path", ids: Sequence[int], *, n_vocab: int) -> Path:
    """Copy the support GGUF ``src`` to ``dst`` with ``ids`` (most frequent first) under :data:`KEY`
    (replacing a list it had); every other key and every tensor byte stay as they are.  Written
    through a temporary file renamed on success, so ``dst`` is never left half-written and ``src``
    may be ``dst``.  Raises :class:`DraftVocabError` for an id outside ``0..n_vocab-1`` or listed
    twice, ``ConversionError`` (naming ``dst``) when it cannot be written."""
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFValueType

    from ds4tui.engine.convert import PlannedTensor, write_gguf
    from ds4tui.engine.gguf_model import field_value, open_gguf
    from ds4tui.engine.layout import TensorSpec

    ids = [int(i) for i in ids]
    why = list_problem(ids, n_vocab) or ("an empty list" if not ids else "")
    if why:
        raise DraftVocabError(f"not written: {why}", str(dst))
    r = open_gguf(src)
    arch = str(field_value(r.fields["general.architecture"]))
    skip = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture", KEY}

    def metadata(w) -> None:
        for name, f in r.fields.items():
            if name not in skip:
                main = f.types[0]
                w.add_key_value(name, field_value(f), main, f.types[-1] if main == GGUFValueType.ARRAY else None)
        w.add_key_value(KEY, ids, GGUFValueType.ARRAY, GGUFValueType.UINT32)

    plan = [PlannedTensor(TensorSpec(t.name, tuple(int(n) for n in reversed(t.shape)), frozenset()), T(int(t.tensor_type)),
                          (lambda t=t: t.data), encoded=True) for t in r.tensors]
    return write_gguf(dst, arch, metadata, plan)
