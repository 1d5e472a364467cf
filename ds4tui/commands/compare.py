"""``ds4tui compare A.json B.json``: two runs side by side.

Reads two JSON files that ds4tui wrote — stats exports of the chat app (F6), ``generate --json``
outputs, ``bench`` or ``bench --ab`` results — flattens each into dotted names (``knobs.scheduler``,
``dspark_stats.stage_timing.verify_ms_per_drafted_cycle``, ``arms[1].tokens_per_s``) and prints:

- the **knobs** that differ: every setting that decides what runs (model and support files,
  backend, numerics, activations, threads, context, the DSpark knobs, sampling, the prompt sizes,
  the optional caches), A's value and B's;
- where each run's DSpark scheduler started (``scheduler_start``, from the file's
  ``scheduler_prices_at_start`` and ``scheduler_prices_retime``: fresh, from the prices earlier runs kept,
  and whether kept times were re-timed) among the knobs when it differs, with a **note** on what that
  means: two runs of one command with the same options draft differently when the second starts from
  the prices the first kept (spec dspark.md §7.4);
- a **warning** when more than one knob differs: then no figure's change can be put down to one of
  them (a memory cache switched on together with DSpark makes the DSpark speed-up unreadable);
- every **figure** both files have (numbers: rates, counts, times, memory), A, B and B/A; the ones
  only one file has as a bounded summary (:func:`names_summary`; ``--json`` lists every one), and a
  **note** when the files have no figure in common (:func:`no_shared_figures`: what each is, what
  to compare instead);
- a **warning** when both files are stats exports of one chat session whose counters ran on
  between them (the same ``counters_id``, B's counts at least A's): B then contains A.
- a **note** for a ``bench --ab`` result whose runs were too short to resolve a few percent (its
  ``noise_note``, :func:`noise_notes`): a B/A near 1 from it says nothing about a change.

Two ``bench --ab`` results print one table per arm instead of the figures (:func:`arm_tables`,
:data:`ARM_ROWS`: tokens/s, the ratio to target-only, accept rate, tokens per cycle, the stage
costs; A, B and B/A), and ``--all`` lists every figure after them.

A ``generate --json`` output and a ``bench`` result are compared under bench's names (the model
path, the context, the prefill and decode tokens/s: :func:`canonical`), and a knob that only one
kind of file records is not counted as a difference.  The warnings are printed once: in the table,
or on stderr with ``--json`` (whose object carries them too).

Lists longer than :data:`MAX_LIST` (token ids, per-token flags) and free text (the generated text,
ds4's stats line, timestamps) are left out.  A file that is not JSON, not an object, not one of
these kinds (a scheduler prices file is named as one), or one of them without the fields its writer
writes or with a field of another JSON type (:data:`FIELDS`), or with a knob of another type or a value
its writer never writes (:data:`KNOBS`: ``"scheduler_prices_at_start": 5`` would be listed as a setting)
is an error naming the file, the field, the expected and the found type or value, and the command that
writes the file (status 1; with ``--json`` also ``{"ok": false, ...}`` on stdout),
and so is a failed run and an interrupted run of any command (``"interrupted": true``; a ``bench --ab``
one named with the runs that finished and those that did not: its arms are not whole, so nothing in
it compares; a ``generate`` one covers only the tokens before the interrupt), except a plain
``bench`` interrupted after its last run (while it measured the memcpy bandwidth): its runs and
fastest run are whole and compare, with a note that its memcpy figure was not measured;
two files of different kinds are compared on the names they share, with a note.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ds4tui.engine.gguf_model import special_file_kind
from ds4tui.interrupts import print_whole

_PREFIX = "ds4tui compare:"

#: Lists up to this length are compared element by element; longer ones are left out.
MAX_LIST = 32
#: A name is a knob when one of its parts (list indices dropped) is one of these: a dict of knobs,
#: or a setting itself.
KNOB_GROUPS = {"knobs", "dspark", "sampling", "settings", "caches", "optional_caches"}
KNOB_NAMES = {
    "model", "path", "support", "backend", "numerics", "activations", "n_threads", "threads", "ctx", "n_ctx",
    "gpu_layout", "gpu_library", "prompt", "prompt_tokens", "decode_tokens", "tokens", "repeat", "raw", "think",
    "support_status", "medium", "name", "mode", "block_size", "kind", "n_predict", "prefill_gemm",
    "gpu_graphs", "scheduler_prices", "draft_vocab", "verify_head", "scheduler_start", "amx", "system",
}
#: The name compare gives where a run's DSpark scheduler started (spec dspark.md §7.4), from the
#: ``scheduler_prices_at_start`` and ``scheduler_prices_retime`` beside it (:func:`scheduler_starts`):
#: a knob, since a run that starts from kept prices drafts differently from one with the same options
#: that starts fresh.
SCHEDULER_START = "scheduler_start"
#: Free text and bookkeeping: never compared.
SKIP_NAMES = {"timestamp", "backend_note", "backend_detail", "decode_timing", "text", "dspark_line", "message", "ok",
              "error", "error_type", "stop", "ids_sha256", "generated_ids", "prompt_ids", "from_draft", "format",
              "chain_fail_op", "invariant_violations", "dominant_no_draft_reason", "dominant_no_draft_reasons",
              "knob_events", "dspark_events", "events", "mismatches", "counters_id", "knobs_in_force", "prompt_text",
              "prefill_gemm_note",
              "gpu_graphs_note", "activations_note", "draft_vocab_note", "verify_head_note", "amx_note",
              "threads_note", "ctx_note", "n_ctx_note"}


#: Bookkeeping at a file's top level only: a transcript's ``saved`` (when it was written), where
#: ``dspark_stats.saved`` is a figure (the decode time accepted drafts saved).
TOP_SKIP_NAMES = {"saved"}


class CompareError(ValueError):
    """A file cannot be compared: the message names it and says why."""


#: What compare reads, in the words of every refusal.
ACCEPTS = ("compare reads the JSON of one run: a stats export of the chat (F6), a transcript (Ctrl+S), "
           "`ds4tui generate --json` output, or a `ds4tui bench` / `bench --ab` result (--json or --out)")

#: The fields each kind of file must have, with their JSON types (a field the comparison reads is
#: checked when present: ``required`` False); an edited or damaged file is named with the field.
FIELDS: dict[str, list[tuple[str, tuple[str, ...], bool]]] = {
    "bench-ab": [("model", ("object",), True), ("backend", ("string",), True), ("arms", ("array",), True),
                 ("tokens", ("integer",), True), ("n_threads", ("integer",), True), ("ctx", ("integer",), False),
                 ("noise_note", ("string", "null"), False)],
    "bench": [("model", ("object",), True), ("backend", ("string",), True),
              ("decode_tokens_per_s", ("number",), True), ("memcpy_gb_per_s", ("number", "null"), True),
              ("prefill_tokens_per_s", ("number",), False), ("ctx", ("integer",), False),
              ("prompt_tokens", ("integer",), False), ("dspark", ("object", "null"), False),
              ("support", ("object", "null"), False)],
    "generate": [("model", ("string",), True), ("backend", ("string",), True), ("generated_ids", ("array",), True),
                 ("timings", ("object",), True), ("prompt_ids", ("array",), False), ("n_ctx", ("integer",), False),
                 ("dspark", ("object", "null"), False)],
    "stats-export": [("model", ("string", "object", "null"), True), ("stats", ("object",), True),
                     ("knobs", ("object", "null"), True), ("interface", ("object", "null"), True),
                     ("n_ctx", ("integer", "null"), False), ("counters_id", ("string", "null"), False)],
}
#: The fields of each element of a ``bench --ab`` result's ``arms``.
ARM_FIELDS = [("name", ("string",), True), ("tokens_per_s", ("number", "null"), True), ("runs", ("array",), False)]
#: What wrote each kind, for the advice in a refusal.
WRITER = {"bench-ab": "ds4tui bench --ab --json", "bench": "ds4tui bench --json", "generate": "ds4tui generate --json",
          "stats-export": "F6 in the chat", "transcript": "Ctrl+S in the chat"}
KIND_WORDS = {"bench-ab": "a `bench --ab` result", "bench": "a `bench` result", "generate": "`generate --json` output",
              "stats-export": "a stats export (F6)", "transcript": "a transcript (Ctrl+S)"}


def json_type(v: Any) -> str:
    """The JSON name of a value's type."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true/false"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(v), type(v).__name__)


def _fits(v: Any, types: tuple[str, ...]) -> bool:
    t = json_type(v)
    return t in types or (t == "integer" and "number" in types)


def _wrong(kind: str, name: str, v: Any, expected: str) -> CompareError:
    """The refusal of a field that holds ``v`` where ``kind``'s writer writes ``expected``."""
    shown = "" if v is None else " " + json.dumps(v)
    shown = shown if len(shown) <= 41 else shown[:38] + "..."
    return CompareError(f"looks like {KIND_WORDS[kind]} but field `{name}` is {json_type(v)}{shown}, expected "
                        f"{expected}: the file was edited or damaged; write it again with {WRITER[kind]}")


def _check_fields(d: dict, fields, kind: str, where: str = "") -> None:
    for name, types, required in fields:
        if name not in d:
            if required:
                raise CompareError(f"looks like {KIND_WORDS[kind]} but has no field `{where}{name}` (expected "
                                   f"{' or '.join(types)}): the file is incomplete; write it again with {WRITER[kind]}")
            continue
        v = d[name]
        if not _fits(v, types):
            raise _wrong(kind, where + name, v, " or ".join(types))
        if name.endswith("_per_s") and isinstance(v, (int, float)) and not isinstance(v, bool) \
                and not (math.isfinite(v) and v >= 0):  # a rate no run writes: NaN, infinite or negative
            raise _wrong(kind, where + name, v, "a finite number >= 0 (a rate)" + (" or null" if "null" in types else ""))


@dataclass(frozen=True)
class Knob:
    """A knob field compare shows (:func:`is_knob`) with the JSON types and the values its writers
    write: ``name`` is its dotted path in the file, ``[]`` standing for each element of an array
    (``arms[].knobs.threshold``); ``allowed``: the strings it may hold (empty: any string);
    ``low`` / ``high``: the least and greatest number (``low_open``: the least is excluded)."""

    name: str
    types: tuple[str, ...]
    allowed: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def under(self, group: str) -> "Knob":
        """The same knob inside the object ``group`` (a dotted path)."""
        return replace(self, name=f"{group}.{self.name}")

    def fits(self, v: Any) -> bool:
        """Whether ``v`` is of one of the types and, for a string or a number, among the values."""
        if not _fits(v, self.types):
            return False
        if isinstance(v, str) and self.allowed:
            return v in self.allowed
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if not math.isfinite(v) or (self.low is not None and (v <= self.low if self.low_open else v < self.low)):
                return False
            return self.high is None or v <= self.high
        return True

    def expected(self) -> str:
        """What the knob holds, in words: ``string "ds4" or "transformers"``, ``number in 0..1``,
        ``integer >= 1 or null``."""
        words = []
        for t in self.types:
            if t == "string" and self.allowed:
                quoted = [json.dumps(a) for a in self.allowed]
                t = f"string {', '.join(quoted[:-1])} or {quoted[-1]}" if len(quoted) > 1 else f"string {quoted[0]}"
            elif t in ("number", "integer") and self.low is not None:
                if self.high is not None:
                    t += (f" in ({self.low:g}, {self.high:g}]" if self.low_open else f" in {self.low:g}..{self.high:g}")
                else:
                    t += f" {'>' if self.low_open else '>='} {self.low:g}"
            words.append(t)
        return " or ".join(words)


def _at_path(d: Any, path: str, name: str = ""):
    """(name, value) for each value at the dotted ``path`` of ``d`` (``[]``: each element of an array,
    named with its index); nothing where a step is missing or of another type (its own knob says so)."""
    head, _, rest = path.partition(".")
    each = head.endswith("[]")
    key = head[:-2] if each else head
    if not isinstance(d, dict) or key not in d:
        return
    v, name = d[key], f"{name}.{key}" if name else key
    values = (list(enumerate(v)) if isinstance(v, list) else []) if each else [(None, v)]
    for i, x in values:
        at = name if i is None else f"{name}[{i}]"
        if rest:
            yield from _at_path(x, rest, at)
        else:
            yield at, x


#: The DSpark knobs (spec dspark.md §7.3): generate's ``dspark``, an export's ``knobs``, each arm's and run's
#: ``knobs`` in a ``bench --ab`` result.
_DSPARK_KNOBS = (Knob("enabled", ("true/false",)), Knob("scheduler", ("true/false",)),
                 Knob("threshold", ("number",), low=0, high=1), Knob("max_draft", ("integer",), low=1),
                 Knob("policy", ("string",), ("acceptance", "confidence")))
_SAMPLING = (Knob("temperature", ("number",), low=0), Knob("top_k", ("integer",), low=0),
             Knob("top_p", ("number",), low=0, high=1, low_open=True), Knob("min_p", ("number",), low=0, high=1),
             Knob("seed", ("integer",), low=0))
_PRICES = ("fresh", "engine", "saved")
#: Where a session's scheduler started (spec dspark.md §7.4): compare's ``scheduler_start`` comes from these.
_START = (Knob("scheduler_prices_at_start", ("string",), _PRICES), Knob("scheduler_prices_retime", ("string", "null")))
#: The engine's options as the run resolved them (auto is never written).
_ENGINE = (Knob("backend", ("string",), ("cpu", "hip", "reference")),
           Knob("numerics", ("string",), ("ds4", "transformers")), Knob("activations", ("string",), ("f32", "q8")),
           Knob("prefill_gemm", ("string",), ("off", "bf16", "f16")), Knob("gpu_graphs", ("string",), ("off", "on")),
           Knob("draft_vocab", ("integer",), low=0), Knob("verify_head", ("string",), ("lazy", "all")),
           Knob("amx", ("string",), ("off", "on")),
           Knob("scheduler_prices", ("string",), _PRICES), Knob("n_threads", ("integer",), low=1))
_SUPPORT = (Knob("support", ("object",)), Knob("support.path", ("string", "null")),
            Knob("support.status", ("string",), ("attached", "refused", "none")),
            Knob("support.block_size", ("integer",), low=0))
_BENCH_MODEL = (Knob("model.path", ("string",)), Knob("model.name", ("string",)),
                Knob("model.file_bytes", ("integer",), low=0), Knob("model.medium", ("true/false",)))
#: The knobs of each kind of file (:func:`is_knob`'s names) with the values their writers write; a
#: knob of another type or out of range would be shown as a setting of the run ("threshold 0.3 -> x"),
#: so it is refused as a field of the wrong type is (:func:`validate`).  A knob that is absent is not
#: checked here (:data:`FIELDS` says which fields a kind must have).
KNOBS: dict[str, tuple[Knob, ...]] = {
    "generate": (*_ENGINE, *_START, *_SUPPORT, Knob("n_predict", ("integer",), low=1),
                 Knob("raw", ("true/false",)), Knob("think", ("true/false", "null")), Knob("prompt", ("string",)),
                 Knob("n_ctx", ("integer",), low=1), Knob("sampling", ("object",)),
                 *(k.under("sampling") for k in _SAMPLING), *(k.under("dspark") for k in _DSPARK_KNOBS),
                 Knob("dspark_stats.block_size", ("integer",), low=0)),
    "bench": (*_ENGINE, *_BENCH_MODEL, Knob("prompt_tokens", ("integer",), low=1), Knob("prompt", ("string",)),
              Knob("decode_tokens", ("integer",), low=1), Knob("ctx", ("integer",), low=1),
              Knob("repeat", ("integer",), low=1), Knob("memcpy.n_threads", ("integer",), low=1),
              *(k.under("dspark") for k in _DSPARK_KNOBS)),
    "bench-ab": (*_ENGINE, *_BENCH_MODEL, *_SUPPORT, Knob("ctx", ("integer",), low=1),
                 Knob("tokens", ("integer",), low=1),
                 Knob("sampling", ("string",)), Knob("prompts", ("array",)), Knob("prompts[].kind", ("string",)),
                 Knob("prompts[].prompt_tokens", ("integer",), low=1), Knob("arm_order", ("array",)),
                 Knob("arm_order[].kind", ("string",)), Knob("arms[].knobs", ("object",)),
                 *(k.under("arms[].knobs") for k in _DSPARK_KNOBS), Knob("arms[].decode_tokens", ("integer",), low=0),
                 Knob("arms[].dspark_stats.block_size", ("integer",), low=0), Knob("arms[].runs[]", ("object",)),
                 Knob("arms[].runs[].kind", ("string",)), Knob("arms[].runs[].knobs", ("object",)),
                 *(k.under("arms[].runs[].knobs") for k in _DSPARK_KNOBS), *(k.under("arms[].runs[]") for k in _START),
                 Knob("arms[].runs[].prompt_tokens", ("integer",), low=1),
                 Knob("arms[].runs[].decode_tokens", ("integer",), low=0),
                 Knob("arms[].runs[].dspark_stats.block_size", ("integer",), low=0)),
    # with no engine open the app writes null for what the engine resolves, and its options (auto) for the rest
    "stats-export": (*(replace(k, types=(*k.types, "null")) if k.name in ("backend", "prefill_gemm", "draft_vocab",
                                                                          "gpu_graphs", "n_threads")
                       else replace(k, allowed=(*k.allowed, "auto")) if k.name in ("activations", "verify_head", "amx")
                       else k for k in _ENGINE),
                     *_START, Knob("support", ("string", "null")),
                     Knob("support_status", ("string",), ("attached", "refused", "none")),
                     Knob("n_ctx", ("integer", "null"), low=1), Knob("sampling", ("object",)),
                     *(k.under("sampling") for k in _SAMPLING), *(k.under("knobs") for k in _DSPARK_KNOBS),
                     Knob("knobs_in_force", ("object", "null")), *(k.under("knobs_in_force") for k in _DSPARK_KNOBS),
                     Knob("dspark_stats.block_size", ("integer",), low=0)),
}


def validate(kind: str, d: dict) -> None:
    """CompareError naming the field, the expected and the found JSON type when ``d`` does not hold
    what ``kind``'s writer writes (:data:`FIELDS`), or the expected and the found value for a knob
    (:data:`KNOBS`)."""
    _check_fields(d, FIELDS[kind], kind)
    if kind == "bench-ab":
        if not d["arms"]:
            raise CompareError(f"looks like {KIND_WORDS[kind]} but its `arms` is empty (expected the three arms): "
                               f"the file is incomplete; write it again with {WRITER[kind]}")
        for i, arm in enumerate(d["arms"]):
            if not isinstance(arm, dict):
                raise CompareError(f"looks like {KIND_WORDS[kind]} but `arms[{i}]` is {json_type(arm)}, expected "
                                   f"object: the file was edited or damaged; write it again with {WRITER[kind]}")
            _check_fields(arm, ARM_FIELDS, kind, f"arms[{i}].")
    for knob in KNOBS[kind]:
        for name, v in _at_path(d, knob.name):
            if not knob.fits(v):
                raise _wrong(kind, name, v, knob.expected())
    _check_figures(d, kind)


def _check_figures(v: Any, kind: str, name: str = "") -> None:
    """Every number at any depth finite, every rate (a field named ``*_per_s``: generate's
    ``timings.decode_tokens_per_s``, a bench run's) >= 0 and every ``accept_rate`` a percent, else
    :func:`_wrong` naming it: no run writes NaN, an infinity, a negative rate or a rate past 100 %, and
    compared they read as a figure or vanished from the table."""
    if isinstance(v, dict):
        for key, x in v.items():
            at = f"{name}.{key}" if name else str(key)
            number = isinstance(x, (int, float)) and not isinstance(x, bool)
            if str(key).endswith("_per_s") and number and not (math.isfinite(x) and x >= 0):
                raise _wrong(kind, at, x, "a finite number >= 0 (a rate) or null")
            if key == "accept_rate" and number and not (math.isfinite(x) and 0 <= x <= 100):
                raise _wrong(kind, at, x, "a percent 0..100 or null")
            if number and not math.isfinite(x):  # no writer writes NaN or an infinity: compared, it vanished
                raise _wrong(kind, at, x, "a finite number")
            _check_figures(x, kind, at)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _check_figures(x, kind, f"{name}[{i}]")


def kind_of(d: dict) -> str:
    """What wrote the object: ``bench-ab``, ``bench``, ``generate``, ``stats-export`` or
    ``transcript``; CompareError for anything else (a scheduler prices file named as such)."""
    fmt = d.get("format")
    if d.get("mode") == "ab" and "arms" in d:
        return "bench-ab"
    if "decode_tokens_per_s" in d and "memcpy_gb_per_s" in d:
        return "bench"
    if "generated_ids" in d and "timings" in d:
        return "generate"
    if isinstance(fmt, str) and fmt.startswith("ds4tui-chat/"):
        return "transcript"
    if "stats" in d and "knobs" in d and "interface" in d:
        return "stats-export"
    if "identity" in d and "prices" in d:
        raise CompareError(f"a DSpark scheduler prices file (what the scheduler keeps between runs under "
                           f"--scheduler-prices saved), not the result of a run; {ACCEPTS}")
    raise CompareError(f"not the result of a ds4tui run: {ACCEPTS}")


#: The largest file compare reads (a run's JSON, a long chat's transcript included, is far smaller):
#: a model file or a device given by mistake is refused before it fills the memory.
MAX_INPUT_BYTES = 256 << 20


def load(path: str) -> tuple[str, dict]:
    """The kind and the object of a JSON file (CompareError naming the file otherwise)."""
    p = Path(path)
    try:
        if p.exists() and not p.is_dir() and not p.is_file():  # a pipe would block, a device never end
            raise CompareError(f"{path}: expected a JSON file, found {special_file_kind(p)}; {ACCEPTS}")
        size = p.stat().st_size if p.is_file() else 0
        if size > MAX_INPUT_BYTES:
            with open(p, "rb") as fh:
                what = " (it looks like a GGUF model file)" if fh.read(4) == b"GGUF" else ""
            raise CompareError(f"{path}: {size} bytes{what}, more than the {MAX_INPUT_BYTES >> 20} MiB a run's "
                               f"JSON can be; {ACCEPTS}")
        data = p.read_bytes()
    except OSError as exc:
        raise CompareError(f"{path}: cannot read: {exc.strerror or exc} (check the path); {ACCEPTS}") from exc
    if not data.strip():
        found = "empty (0 bytes)" if not data else f"blank ({len(data)} bytes of white space only)"
        raise CompareError(f"{path}: the file is {found}, expected JSON (a run that failed or was stopped leaves the "
                           f"file its output was redirected to empty); {ACCEPTS}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        what = "a GGUF model file" if data[:4] == b"GGUF" else "binary data"
        raise CompareError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}; it looks "
                           f"like {what}, starting {data[:8].hex(' ')}), expected JSON; {ACCEPTS}") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        # the parser reached the end of the text (a string runs to it, or the error is there): cut short
        cut = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")
        start = text.lstrip()[:24]
        found = "" if cut else f" (it starts {json.dumps(start)}{'...' if len(text.lstrip()) > 24 else ''})"
        raise CompareError(f"{path}: not JSON: {exc.msg}: line {exc.lineno} column {exc.colno}{found}"
                           + ("; the file ends before its JSON does: it was cut short (truncated); write it again"
                              if cut else "") + f"; {ACCEPTS}") from None
    if not isinstance(d, dict):
        raise CompareError(f"{path}: expected a JSON object, found {json_type(d)}; {ACCEPTS}")
    interrupted = d.get("ok") is False and d.get("interrupted") is True
    # a plain `bench` interrupted after its last run (while the memcpy bandwidth was measured) keeps
    # its whole result: its runs compare, only the memcpy figure and the ratio are missing
    runs_whole = (interrupted and "generated_ids" not in d and "runs" in d and d.get("mode") != "ab"
                  and "decode_tokens_per_s" in d)
    if interrupted and not runs_whole:
        error = d.get("error", "no error text")
        if "generated_ids" in d:
            raise CompareError(f"{path}: an interrupted `generate` run ({error}): its figures cover only what ran "
                               f"before the interrupt; its text and ids are kept in it; run `ds4tui generate` to the "
                               f"end to compare")
        if "runs" not in d:
            cmd = d.get("command")
            raise CompareError(f"{path}: an interrupted run" + (f" of `ds4tui {cmd}`" if isinstance(cmd, str) else "")
                               + f" ({error}): it holds no result to compare; run it to the end")
        if d.get("mode") != "ab":
            raise CompareError(f"{path}: an interrupted `bench` run ({error}): it has no fastest run to compare with "
                               f"another run's; its finished runs' own figures are in its `runs`; run `ds4tui bench` "
                               f"to the end to compare")

        def runs(key: str) -> str:
            items = d.get(key)
            if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
                return "?"
            return ", ".join(f"{x.get('arm')} {x.get('kind')}" for x in items) or "none"

        raise CompareError(f"{path}: an interrupted `bench --ab` run ({error}; finished: {runs('finished')}; not "
                           f"finished: {runs('not_finished')}): its arms are not whole, so no figure of it compares "
                           f"with another run's; its finished runs' own figures are in its `runs`; run `ds4tui bench "
                           f"--ab` to the end to compare")
    if d.get("ok") is False and not runs_whole:
        raise CompareError(f"{path}: a failed run ({d.get('error', 'no error text')})")
    fmt = d.get("format")
    try:
        if isinstance(fmt, str) and fmt.startswith("ds4tui-chat/"):  # a transcript: its session block is the export
            session = d.get("session")
            if not isinstance(session, dict) or not session:
                found = "an empty object" if session == {} else json_type(session)
                raise CompareError(f"looks like {KIND_WORDS['transcript']} but field `session` is {found}, "
                                   f"expected an object holding the session's stats (a transcript saved before "
                                   f"any answer has none): save it again after an answer")
            try:
                kind = kind_of(session)
            except CompareError:
                kind = None
            if kind != "stats-export":
                raise CompareError(f"looks like {KIND_WORDS['transcript']} but its `session` is not a stats export: "
                                   f"the file was edited or damaged; save it again with Ctrl+S in the chat")
            validate(kind, session)
            return "transcript", dict(session, format=fmt)
        kind = kind_of(d)
        validate(kind, d)
        return kind, d
    except CompareError as exc:
        raise CompareError(f"{path}: {exc}") from None


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted names → scalars (str, int, float, bool, None); lists of at most :data:`MAX_LIST`
    items are indexed (``a[3]``), longer ones and the names of :data:`SKIP_NAMES` left out."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in SKIP_NAMES or (k in TOP_SKIP_NAMES and not prefix):
                continue
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, list):
        if len(obj) <= MAX_LIST:
            for i, v in enumerate(obj):
                out.update(flatten(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = obj
    return out


def _parts(name: str) -> list[str]:
    return [p.split("[")[0] for p in name.split(".")]


def is_knob(name: str) -> bool:
    """Whether ``name`` is a setting (a variable of the run) rather than a figure it measured."""
    parts = _parts(name)
    return any(p in KNOB_GROUPS for p in parts) or parts[-1] in KNOB_NAMES or \
        (len(parts) >= 2 and parts[-2] == "model" and parts[-1] in ("path", "name", "file_bytes")) or \
        (len(parts) >= 2 and parts[-2] == "support" and parts[-1] == "status")


def scheduler_starts(flat: dict[str, Any]) -> dict[str, Any]:
    """``flat`` (:func:`flatten`'s names) with a ``scheduler_start`` beside each
    ``scheduler_prices_at_start`` of a run whose DSpark scheduler decided what was drafted (the
    ``dspark`` knobs of ``generate``, the ``knobs`` of a ``bench --ab`` run: enabled, scheduler on):
    ``fresh``, ``saved`` (from the prices earlier runs kept) or ``engine`` (from an earlier session of
    the run), followed by ``, kept times re-timed`` when ``scheduler_prices_retime`` says that some
    kept times were left out for drafting to measure again.  A run without the scheduler gets none:
    where it would have started changed nothing."""
    out = dict(flat)
    for name, start in flat.items():
        if _parts(name)[-1] != "scheduler_prices_at_start" or not isinstance(start, str):
            continue
        at = name[:-len("scheduler_prices_at_start")]
        group = next((g for g in ("dspark", "knobs") if f"{at}{g}.enabled" in flat), None)
        if group is None or flat[f"{at}{group}.enabled"] is not True or flat.get(f"{at}{group}.scheduler") is not True:
            continue
        out[at + SCHEDULER_START] = start + (", kept times re-timed" if flat.get(f"{at}scheduler_prices_retime")
                                             else "")
    return out


def scheduler_start_note(knobs: list) -> str | None:
    """The note when the runs' DSpark schedulers started differently (a ``scheduler_start`` among the
    knobs that differ), with what the values mean and how to leave it out of an A/B; None otherwise."""
    if not any(_parts(k)[-1] == SCHEDULER_START for k, _, _ in knobs):
        return None
    return ("the DSpark scheduler started differently in the two runs (scheduler_start: fresh measures its own "
            "prices, saved starts from the prices earlier runs kept, engine from an earlier session's, re-timed "
            "measures some kept times again): what it drafts, and every DSpark figure, can differ for that alone; "
            "for an A/B, run both with --scheduler-prices fresh")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _rename(d: dict, old: str, new: str) -> None:
    """``d[old]`` (and its note, ``old_note``) under ``new`` (``new_note``), where present."""
    for a, b in ((old, new), (f"{old}_note", f"{new}_note")):
        if a in d:
            d[b] = d.pop(a)


def knobs_that_ran(d: dict) -> dict:
    """A stats export with the knobs its counted cycles ran with (``knobs_in_force``) as its ``knobs``: a change
    made after its last cycle (F2 after the answer, then F6) ran in no cycle, and compared as the run's knobs it
    called a session that drafted one with DSpark off.  Other files as they are."""
    in_force = d.get("knobs_in_force")
    return {**d, "knobs": in_force} if isinstance(in_force, dict) and isinstance(d.get("knobs"), dict) else d


def canonical(kind: str, d: dict) -> dict:
    """Every kind under one set of names, so that two kinds compare: ``generate --json`` and
    stats exports under ``bench``'s names (the model path as ``model.path``, the context as
    ``ctx``, the prompt's length as ``prompt_tokens``, the prefill and decode tokens/s at the top:
    generate keeps them under ``timings``); an export's DSpark knobs under generate's ``dspark``
    (the same four names); a plain ``bench`` records that it ran target-only
    (``dspark.enabled`` false) with no support model (``support.path`` None, ``support.status``
    none: its weights in memory differ from a run that attached one).  Other kinds are returned as they are."""
    if kind == "bench":  # a plain bench attaches no support model: a difference from a run that did
        return {**d, "dspark": d.get("dspark") or {"enabled": False},
                "support": d.get("support") or {"path": None, "status": "none"}}
    if kind == "stats-export":
        d = dict(d)
        if isinstance(d.get("model"), str):
            d["model"] = {"path": d["model"]}
        _rename(d, "n_ctx", "ctx")
        if "knobs" in d:
            d["dspark"] = d.pop("knobs")
        return d
    if kind != "generate":
        return d
    d = dict(d)
    if isinstance(d.get("model"), str):
        d["model"] = {"path": d["model"]}
    _rename(d, "n_ctx", "ctx")
    if isinstance(d.get("prompt_ids"), list):  # bench's "prompt" is the kind of prompt, not its text
        d["prompt_tokens"] = len(d["prompt_ids"])
        d["prompt_text"] = d.pop("prompt", None)
    timings = dict(d.get("timings") or {})
    for k in ("prefill_tokens_per_s", "decode_tokens_per_s"):
        if k in timings:
            d[k] = timings.pop(k)
    d["timings"] = timings
    return d


def contains(a: dict, b: dict) -> bool:
    """Whether B's counters include A's: both are exports of one run of the chat's counters (the
    same ``counters_id``: one session, never reset in between) and every count of B's ``stats``
    and ``dspark_stats`` is at least A's."""
    ida, idb = a.get("counters_id"), b.get("counters_id")
    if not ida or ida != idb:
        return False
    fa, fb = flatten(a), flatten(b)
    counts = [k for k in fa if _parts(k)[0] in ("stats", "dspark_stats") and isinstance(fa[k], int)
              and not isinstance(fa[k], bool) and isinstance(fb.get(k), int)]
    return all(fb[k] >= fa[k] for k in counts)


def compare(a: dict, b: dict, *, same_kind: bool = True) -> dict:
    """``knobs``: [name, A, B] for every knob that differs (with ``same_kind`` False, two kinds
    of file: only knobs both record; one recorded by one kind only is not a difference);
    ``figures``: [name, A, B, B/A or None] for every number both have (``zero_in_both`` counts
    the ones left out for being 0 in both); ``only_a`` / ``only_b``: names one of them lacks;
    ``variables``: how many variables the knobs are (one may be recorded under several names);
    ``warning``: the text when more than one variable differs (else None); ``contains``: "b" when
    B's counters include A's (:func:`contains`), "a" the other way round, else None;
    ``scheduler_start_note``: the note when the DSpark schedulers started differently
    (:func:`scheduler_starts`, :func:`scheduler_start_note`), else None."""
    fa, fb = scheduler_starts(_policy_of_old_files(flatten(a))), scheduler_starts(_policy_of_old_files(flatten(b)))
    names = sorted(set(fa) | set(fb)) if same_kind else sorted(set(fa) & set(fb))
    # a scheduler start in one run only: the other ran without the scheduler, and its knobs say so
    knobs = [[k, fa.get(k), fb.get(k)] for k in names if is_knob(k) and fa.get(k) != fb.get(k)
             and (_parts(k)[-1] != SCHEDULER_START or (k in fa and k in fb))]
    figures, zeros = [], 0
    for k in fa:
        if k in fb and not is_knob(k) and _is_number(fa[k]) and _is_number(fb[k]):
            if fa[k] == 0 and fb[k] == 0:
                zeros += 1
                continue
            ratio = fb[k] / fa[k] if fa[k] else None
            figures.append([k, fa[k], fb[k], ratio])
    only_a = sorted(k for k in fa if k not in fb and not is_knob(k) and _is_number(fa[k]))
    only_b = sorted(k for k in fb if k not in fa and not is_knob(k) and _is_number(fb[k]))
    # one variable may be recorded under several names (n_threads and memcpy.n_threads): counted once;
    # the scheduler's start is one variable in every run that records it, and none beside a prices mode
    # that differs too (it follows from it)
    variables: dict[tuple, str] = {}
    mode_moved = any(_parts(k)[-1] == "scheduler_prices" for k, _, _ in knobs)
    # a setting that both runs left at auto (its note says "auto: ...") follows from the others: beside
    # a knob that differs and was set (activations), it is no variable of its own (amx, verify_head)
    na, nb = _notes(a), _notes(b)
    derived = [k for k, _, _ in knobs if _auto(na, k) and _auto(nb, k)]
    if len(derived) == len(knobs):
        derived = []
    # a DSpark knob of a run whose DSpark was off decided nothing there: beside DSpark on against off it is
    # no variable of its own (scheduler on against off, with DSpark off in one of the runs)
    moot = [k for k, _, _ in knobs if k not in derived and _moot_dspark_knob(k, fa, fb)]
    # a support model attached in one run only: what only a drafter has (its block size, the draft
    # vocabulary, DSpark's knobs, null in the other run) moves with it
    support_moved = any(_parts(k)[:-1] == ["support"] for k, _, _ in knobs)
    for k, x, y in knobs:
        if k in derived or k in moot:
            continue
        if _parts(k)[-1] == SCHEDULER_START:
            if not mode_moved:
                variables.setdefault((SCHEDULER_START,), k)
            continue
        if _parts(k)[:-1] == ["support"] or (support_moved and (
                x is None or y is None or _parts(k)[-1] in ("block_size", "draft_vocab"))):
            variables.setdefault(("support",), k)  # its path and status, and what follows: one variable
            continue
        variables.setdefault((_parts(k)[-1], json.dumps(x), json.dumps(y)), k)
    warning = None
    if len(variables) > 1:
        names = ", ".join(variables.values())
        warning = (f"{len(variables)} variables differ between the runs ({names}): no change in the figures can be "
                   f"put down to any one of them; for an A/B, change one knob at a time")
    inside = "b" if contains(a, b) else "a" if contains(b, a) else None
    return {"knobs": knobs, "variables": len(variables), "derived": derived, "moot": moot, "figures": figures,
            "zero_in_both": zeros,
            "only_a": only_a, "only_b": only_b, "warning": warning, "contains": inside,
            "scheduler_start_note": scheduler_start_note(knobs)}


def _policy_of_old_files(flat: dict[str, Any]) -> dict[str, Any]:
    """``flat`` with ``policy`` "acceptance" in each DSpark knob group (``dspark``, ``knobs``) that has none:
    a file written before the scheduler had policies (2026-12-06) ran the only one there was."""
    for k in [k for k in flat if k.endswith(".enabled")]:
        group = k[: -len(".enabled")]
        if _parts(group)[-1] in ("dspark", "knobs") and f"{group}.scheduler" in flat and f"{group}.policy" not in flat:
            flat[f"{group}.policy"] = "acceptance"
    return flat


def _moot_dspark_knob(name: str, fa: dict[str, Any], fb: dict[str, Any]) -> bool:
    """Whether ``name`` is a DSpark knob (``dspark.scheduler``, ``arms[1].knobs.threshold``) of a group whose
    ``enabled`` is false in a run: that run drafted nothing, so the knob decided nothing there (both runs
    off: in neither); the same for the scheduler's ``policy`` where its ``scheduler`` is false."""
    parts = name.rsplit(".", 1)
    if len(parts) != 2 or parts[1] == "enabled" or _parts(parts[0])[-1] not in ("dspark", "knobs"):
        return False
    on, sched = f"{parts[0]}.enabled", f"{parts[0]}.scheduler"
    if parts[1] == "policy" and (fa.get(sched) is False or fb.get(sched) is False):
        return True  # the policy is the scheduler's: without it, it decided nothing
    return fa.get(on) is False or fb.get(on) is False  # off in one run, or in both: it decided nothing there


def _notes(obj: Any, prefix: str = "") -> dict[str, str]:
    """The notes of a run (``amx_note``, ``arms[0].verify_head_note``), by dotted name as :func:`flatten`
    names the rest (which leaves them out)."""
    out: dict[str, str] = {}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        name = (f"{prefix}[{k}]" if isinstance(k, int) else f"{prefix}.{k}" if prefix else str(k))
        if isinstance(k, str) and k.endswith("_note") and isinstance(v, str):
            out[name] = v
        elif isinstance(v, (dict, list)):
            out.update(_notes(v, name))
    return out


def _auto(notes: dict[str, str], key: str) -> bool:
    """Whether the run chose the setting ``key`` itself: the note beside it (``amx_note``) says
    ``auto: ...``."""
    return notes.get(f"{key}_note", "").startswith("auto:")


def contains_warning(inside: str | None, counters_id: str | None) -> str | None:
    """The warning text when one export's counters include the other's (None otherwise)."""
    if inside is None:
        return None
    big, small = ("B", "A") if inside == "b" else ("A", "B")
    return (f"{big} contains {small}: both are exports of one chat session (counters {counters_id}) and {big}'s "
            f"counters include {small}'s, so {big}'s figures cover {small}'s turns too and a knob changed in "
            f"between is not an A/B; start a new session between the two runs (in the chat: Ctrl+G, or start it again)")


def _unsigned_zero(text: str) -> str:
    """A formatted number without the minus sign of a value that prints as zero (``-0.000``: a
    tiny negative ratio, or -0.0 itself), which reads as a loss that is not there."""
    return text[1:] if text.startswith("-") and set(text[1:]) <= set("0.x%") else text


def _ratio(q: float | None) -> str:
    """A B/A column's cell."""
    return "-" if q is None else _unsigned_zero(f"{q:.3f}")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return _unsigned_zero(f"{v:.6g}")
    return json.dumps(v) if isinstance(v, str) or v is None else str(v)


def figure_unit(name: str) -> str:
    """The unit of a figure by its JSON name, as ds4tui's results name them: ``*tokens_per_s`` tok/s,
    ``*gb_per_s`` GB/s, ``*_ms``, ``*_ms_per_*``, ``ms_per_*.*`` and ds4's stat times (``dspark_stats.verify``,
    ``prop_chain``, …: :data:`ds4tui.engine.stats.TIMES`) ms, ``*_s`` and ``*_seconds`` s, ``memory.*``,
    ``*bytes*`` and ``bytes_per_token*`` bytes, ``accept_rate`` %, ``*cores`` cores, context sizes and
    positions tokens (a ``bench --ab`` arm's or run's figures as the same names alone); "" for a count,
    a ratio or a name of none of these forms."""
    from ds4tui.engine.stats import TIMES

    parts = [p.split("[")[0] for p in name.split(".")]
    while len(parts) > 1 and parts[0] in ("arms", "runs"):  # a bench --ab arm's or run's figure: as its own
        parts = parts[1:]
    last = parts[-1]
    if last in ("at_ctx", "ctx", "n_ctx", "prompt_tokens", "n_tokens"):
        return "tokens"
    if last.endswith("tokens_per_s"):
        return "tok/s"
    if last.endswith("gb_per_s"):
        return "GB/s"
    if last.endswith("_ms") or "_ms_per_" in last or any(p.startswith("ms_per_") for p in parts[:-1]) or (
            parts[0] in ("dspark_stats", "stats") and last in TIMES):
        return "ms"
    if last.endswith("_seconds") or last == "seconds" or (last.endswith("_s") and not last.endswith("per_s")):
        return "s"
    if parts[0] in ("memory", "bytes_per_token", "bytes_per_token_detail") or "bytes" in last:
        return "bytes"
    if last == "accept_rate":
        return "%"
    if last.endswith("cores"):
        return "cores"
    return ""


def render(path_a: str, path_b: str, kind_a: str, kind_b: str, r: dict, *, every_figure: bool = False) -> str:
    """The text report of :func:`compare`'s result ``r``: the two files and their kinds, the knobs
    that differ, the warnings, then every figure as A, B and B/A.  When ``r`` holds ``arms`` (two
    ``bench --ab`` results, :func:`arm_tables`) the figures are one table per arm instead, and a
    line counting the rest; with ``every_figure`` every figure follows the tables."""
    lines = [f"A  {path_a}  ({kind_a})", f"B  {path_b}  ({kind_b})"]
    if kind_a != kind_b:
        lines.append("note: different kinds of file: only the names both have are compared")
    lines.append("")
    if r["knobs"]:
        w = max(len(k) for k, _, _ in r["knobs"])
        n, v = len(r["knobs"]), r["variables"]
        lines.append(f"knobs that differ ({n}):" if n == v
                     else f"knobs that differ ({n}, none a variable of the runs):" if v == 0
                     else f"knobs that differ ({v} variable{'' if v == 1 else 's'} under {n} names):")
        lines += [f"  {k:<{w}}  {_fmt(x)} -> {_fmt(y)}" for k, x, y in r["knobs"]]
        if r.get("derived"):
            it, follows, is_, its = ("it", "follows", "is", "its") if len(r["derived"]) == 1 else \
                ("they", "follow", "are", "their")
            lines.append(f"  ({', '.join(r['derived'])}: auto in both runs, so {it} {follows} from the knobs above "
                         f"and {is_} no variable of {its} own)")
        if r.get("moot"):
            off = "DSpark or its scheduler" if any(k.endswith(".policy") for k in r["moot"]) else "DSpark"
            lines.append(f"  ({', '.join(r['moot'])}: no effect where {off} was off, so no variable of "
                         f"{'its' if len(r['moot']) == 1 else 'their'} own)")
    elif r.get("same_run"):
        lines.append(f"NOTE: {r['same_run']}")
    elif r.get("knob_change_warnings"):
        lines.append("knobs: the same at the end of both runs (but see below: they changed during a run)")
    elif r.get("contains_warning"):  # one session's counters at two times: no two runs, no noise between them
        lines.append("knobs: the same (one chat session at two times: see below)")
    else:
        lines.append("knobs: the same in both runs (the figures differ by run-to-run noise only)")
    for w in (r["warning"], r.get("contains_warning"), *(r.get("knob_change_warnings") or ())):
        if w:
            lines += ["", f"WARNING: {w}"]
    if r.get("scheduler_start_note"):
        lines += ["", f"NOTE: {r['scheduler_start_note']}"]
    for note in r.get("noise_notes") or ():  # before the figures: it qualifies every one of them
        lines += ["", f"NOTE: {note}"]
    lines.append("")
    arms = r.get("arms")
    if arms is not None:
        lines += render_arms(arms)
        if not every_figure:
            shown = sum(len(t["rows"]) for t in arms["tables"])
            lines.append(f"(the tables hold {shown} figures; --all lists every one of the {len(r['figures'])} both runs "
                         f"have by its JSON name, as --json does; {r['zero_in_both']} more are 0 in both)")
        else:
            lines += ["", "every figure both runs have, by its JSON name:"]
    if r["figures"] and (arms is None or every_figure):
        w = max(len(k) for k, *_ in r["figures"])
        lines.append(f"{'figure':<{w}}  {'A':>14} {'B':>14} {'unit':<6} {'B/A':>8}")
        for k, x, y, q in r["figures"]:
            lines.append(f"{k:<{w}}  {_fmt(x):>14} {_fmt(y):>14} {figure_unit(k):<6} {_ratio(q):>8}")
    if r["zero_in_both"] and (arms is None or every_figure):
        lines.append(f"({r['zero_in_both']} more figures are 0 in both runs)")
    if r.get("no_shared_figures"):
        lines.append(f"NOTE: {r['no_shared_figures']}")
    for note in r.get("interrupted_notes") or ():
        lines.append(f"NOTE: {note}")
    for side, names in (("A", r["only_a"]), ("B", r["only_b"])):
        tabled = [n for n in names if _in_arm_tables(n)] if arms is not None and not every_figure else []
        if tabled:  # the arms' tables show them as "-"
            lines.append(f"only in {side}: {len(tabled)} figure{'s' if len(tabled) > 1 else ''} of the tables (a \"-\" "
                         f"in the other run's column; --all names {'them' if len(tabled) > 1 else 'it'})")
        rest = [n for n in names if n not in tabled]
        if rest:
            lines.append(f"only in {side}{', besides' if tabled else ''}: {names_summary(rest)}")
    return "\n".join(lines)


#: The figures of an arm that two ``bench --ab`` results are compared on (:func:`arm_tables`): the
#: label, the path in an arm (and in each of its runs), the unit, whether it is also given per prompt
#: (each run of the arm), whether only a DSpark arm has it (``knobs.enabled``), and whether it is
#: measured against the target-only arm (1 by construction in that arm, so left out there).
ARM_ROWS: tuple[tuple[str, tuple[str, ...], str, bool, bool, bool], ...] = (
    ("tokens/s", ("tokens_per_s",), "rate", True, False, False),
    ("vs target-only", ("ratio_to_target",), "x", True, False, True),
    ("accept rate", ("accept_rate",), "%", False, True, False),
    ("tokens per cycle", ("tokens_per_cycle",), "n", True, True, False),
    ("cycles", ("dspark_stats", "cycles"), "count", False, True, False),
    ("drafted cycles", ("stage_timing", "drafted_cycles"), "count", False, True, False),
    ("drafter pass (ms)", ("stage_timing", "ms_per_drafter_pass", "propose"), "ms", False, True, False),
    ("verify per drafted cycle (ms)", ("stage_timing", "verify_ms_per_drafted_cycle"), "ms", False, True, False),
    ("verify in target-only decodes", ("verify_over_target_decode", "ratio"), "x", False, True, True),
    ("plain decode (ms)", ("stage_timing", "decode_ms_per_plain_decode"), "ms", False, False, False),
)


def _at(d: Any, path: tuple[str, ...]) -> float | None:
    """The number at ``path`` in nested dicts, None when a step is missing or the value is not a finite number."""
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d if _is_number(d) else None


def _arm_knobs(arm: dict) -> str:
    """An arm's DSpark knobs in words: ``DSpark off``, or ``DSpark on, scheduler off`` with the
    confidence threshold and the longest draft."""
    k = arm.get("knobs") if isinstance(arm.get("knobs"), dict) else {}
    if not k.get("enabled", False):
        return "DSpark off"
    policy = k.get("policy", "acceptance")  # a result written before the scheduler had policies ran this one
    on = f"on ({policy})" if isinstance(policy, str) else "on"
    words = [f"DSpark on, scheduler {on if k.get('scheduler') else 'off'}"]
    if _is_number(k.get("threshold")):
        words.append(f"confidence {k['threshold']:g}")
    if _is_number(k.get("max_draft")):
        words.append(f"max draft {k['max_draft']}")
    return ", ".join(words)


def _runs_by_kind(arm: dict) -> dict[str, dict]:
    runs = arm.get("runs") if isinstance(arm.get("runs"), list) else []
    return {r["kind"]: r for r in runs if isinstance(r, dict) and isinstance(r.get("kind"), str)}


def _in_arm_tables(name: str) -> bool:
    """Whether the figure ``name`` (flattened: ``arms[2].runs[0].tokens_per_s``) is one the arms'
    tables show (a figure of :data:`ARM_ROWS`, of an arm or of one of its runs)."""
    m = re.fullmatch(r"arms\[\d+\]\.(?:runs\[\d+\]\.)?(.+)", name)
    return bool(m) and any(m.group(1) == ".".join(path) for _, path, *_ in ARM_ROWS)


def arm_tables(a: dict, b: dict) -> dict:
    """Two ``bench --ab`` results arm by arm, the arms matched by name (their order in A):
    ``tables``: per arm present in both, ``{"arm", "knobs_a", "knobs_b", "rows"}`` with the knobs in
    words (:func:`_arm_knobs`) and ``rows`` [label, prompt kind or None (all prompts), A, B, B/A or
    None] for each figure of :data:`ARM_ROWS` that either run has (a prompt's row follows its
    figure's; the prompts matched by kind); ``only_a`` / ``only_b``: the names of arms one file lacks;
    ``outputs_identical``: [A's, B's] (whether all arms generated the same ids in that run).
    Tokens/s and ms are per the arm's timed steps; ``accept rate`` in percent; ``vs target-only`` and
    ``verify in target-only decodes`` are ratios to the file's own first arm (target-only)."""
    arms_a = [x for x in a["arms"] if isinstance(x, dict)]
    arms_b = {x["name"]: x for x in b["arms"] if isinstance(x, dict)}
    reference = arms_a[0]["name"] if arms_a else None
    tables = []
    for arm_a in arms_a:
        arm_b = arms_b.get(arm_a["name"])
        if arm_b is None:
            continue
        dspark = any(isinstance(x.get("knobs"), dict) and x["knobs"].get("enabled") for x in (arm_a, arm_b))
        runs_a, runs_b = _runs_by_kind(arm_a), _runs_by_kind(arm_b)
        kinds = list(runs_a) + [k for k in runs_b if k not in runs_a]
        rows = []
        for label, path, _unit, per_prompt, dspark_only, vs_reference in ARM_ROWS:
            if (dspark_only and not dspark) or (vs_reference and arm_a["name"] == reference):
                continue
            pairs = [(None, _at(arm_a, path), _at(arm_b, path))]
            if per_prompt:
                pairs += [(k, _at(runs_a.get(k), path), _at(runs_b.get(k), path)) for k in kinds]
            for kind, x, y in pairs:
                if x is None and y is None:
                    continue
                rows.append([label, kind, x, y, y / x if x is not None and y is not None and x else None])
        tables.append({"arm": arm_a["name"], "knobs_a": _arm_knobs(arm_a), "knobs_b": _arm_knobs(arm_b),
                       "rows": rows})
    names_a = [x["name"] for x in arms_a]
    return {"tables": tables, "only_a": [n for n in names_a if n not in arms_b],
            "only_b": [n for n in arms_b if n not in names_a],
            "outputs_identical": [a.get("outputs_identical"), b.get("outputs_identical")]}


def _cell(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "count":
        return _unsigned_zero(f"{v:.0f}")
    if unit == "x":
        return _unsigned_zero(f"{v:.3f}x")
    if unit == "%":
        return _unsigned_zero(f"{v:.2f}%")
    if unit == "rate":
        return _unsigned_zero(f"{v:.2f}")
    return _unsigned_zero(f"{v:.3f}")


def render_arms(t: dict) -> list[str]:
    """The text of :func:`arm_tables`' result: one header of the columns (A, B and B/A), then a
    table per arm under its name and knobs, the columns lined up across the tables; then the arms
    one file lacks and whether each run's arms generated the same greedy ids."""
    units = {label: unit for label, _, unit, *_ in ARM_ROWS}
    labels = [f"    {kind} prompt" if kind else f"  {label}" for table in t["tables"]
              for label, kind, *_ in table["rows"]]
    w = max([len(x) for x in labels] or [0])
    lines = [f"{'per arm':<{w}}  {'A':>12} {'B':>12} {'B/A':>8}"]
    for table in t["tables"]:
        knobs = (table["knobs_a"] if table["knobs_a"] == table["knobs_b"]
                 else f"A: {table['knobs_a']}; B: {table['knobs_b']}")
        lines.append(f"{table['arm']}: {knobs}")
        for label, kind, x, y, q in table["rows"]:
            name = f"    {kind} prompt" if kind else f"  {label}"
            lines.append(f"{name:<{w}}  {_cell(x, units[label]):>12} {_cell(y, units[label]):>12} "
                         f"{_ratio(q):>8}")
    lines.append("")
    for side, names in (("A", t["only_a"]), ("B", t["only_b"])):
        if names:
            lines.append(f"arms only in {side}: {', '.join(names)} (not compared)")
    same = ["identical in every arm" if v is True else "DIFFERENT between arms (see its `mismatches`)"
            if v is False else "not recorded" for v in t["outputs_identical"]]
    lines.append(f"greedy outputs: {same[0]} in both runs" if same[0] == same[1]
                 else f"greedy outputs: A {same[0]}; B {same[1]}")
    return lines


#: How many names, and how many groups of names, the text report shows of a list it summarises.
SHOWN_NAMES, SHOWN_GROUPS = 3, 4


def names_summary(names: list[str]) -> str:
    """A bounded line for a list of figure names: all of them when there are at most
    :data:`SHOWN_NAMES` + 3; else the count, the count under each top-level name (the largest
    :data:`SHOWN_GROUPS`) and the first :data:`SHOWN_NAMES` names, pointing at ``--json`` (which
    lists every one)."""
    if len(names) <= SHOWN_NAMES + 3:
        return ", ".join(names)
    groups: dict[str, int] = {}
    for name in names:
        top = _parts(name)[0]
        groups[top] = groups.get(top, 0) + 1
    ranked = sorted(groups.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{g} {n}" for g, n in ranked[:SHOWN_GROUPS])
    if len(ranked) > SHOWN_GROUPS:
        shown += f", {len(ranked) - SHOWN_GROUPS} more group{'s' if len(ranked) - SHOWN_GROUPS > 1 else ''}"
    return (f"{len(names)} figures (under {shown}), e.g. {', '.join(names[:SHOWN_NAMES])}; "
            f"--json lists every one")


def _describe(path: str, kind: str, d: dict) -> str:
    """One file in words: its path, its kind, what writes it, and its model and backend when it names them."""
    model = d.get("model")
    model = model.get("path") if isinstance(model, dict) else model
    what = [f"model {model}"] if isinstance(model, str) and model else []
    if isinstance(d.get("backend"), str):
        what.append(f"backend {d['backend']}")
    return f"{path} is {KIND_WORDS[kind]} (written by {WRITER[kind]}{'; ' + ', '.join(what) if what else ''})"


def no_shared_figures(path_a: str, path_b: str, kind_a: str, kind_b: str, a: dict, b: dict) -> str:
    """The note when two files have no figure in common: what each file is and what to compare instead."""
    if kind_a == kind_b:
        todo = (f"compare two runs of the same command with the same options (e.g. {WRITER[kind_a]} "
                f"twice, changing one knob)")
    else:
        todo = (f"give two files of one kind: {path_a} with another file written by {WRITER[kind_a]}, or {path_b} "
                f"with another written by {WRITER[kind_b]}")
    return (f"the two files share no figures, so there is nothing to set side by side: A {_describe(path_a, kind_a, a)}; "
            f"B {_describe(path_b, kind_b, b)}; {todo}")


#: At most this many characters of a file's own ``noise_note`` are repeated.
NOISE_NOTE_CHARS = 160
#: Terminal escape sequences (CSI ``ESC [ ... final``, OSC ``ESC ] ... BEL|ESC \\``, two-character ones).
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?|\x9b[0-?]*[ -/]*[@-~]")


def _noise_clause(kind: str, d: dict) -> str | None:
    """What a ``bench --ab`` result's ``noise_note`` measured (its text before the first ": ", the
    shortest and longest run), on one line without control characters and cut to
    :data:`NOISE_NOTE_CHARS`; None for another kind of file or without a note."""
    note = d.get("noise_note") if kind == "bench-ab" else None
    if not isinstance(note, str):
        return None
    text = _ESCAPES.sub(" ", note)  # whole terminal escape sequences, then any other control character
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    text = text.split(": ", 1)[0].strip()
    if not text:
        return None
    return text if len(text) <= NOISE_NOTE_CHARS else text[:NOISE_NOTE_CHARS - 3] + "..."


def noise_notes(path_a: str, path_b: str, kind_a: str, kind_b: str, a: dict, b: dict) -> list[str]:
    """The note (a list of none or one) when a ``bench --ab`` result says its runs were too short to
    resolve a few percent (its ``noise_note``, :func:`ds4tui.commands.bench.ab_noise_note`): a B/A of
    its figures near 1 is within the noise of one such run.  One note for both files when both say so."""
    ca, cb = _noise_clause(kind_a, a), _noise_clause(kind_b, b)
    tail = "a B/A within a few percent of 1 says nothing about a change"
    if ca and cb:
        return [f"A and B ran short (A: {ca}; B: {cb}): {tail}; their bench reports say what resolves a few percent"]
    for side, path, clause in (("A", path_a, ca), ("B", path_b, cb)):
        if clause:
            return [f"{side} ({path}) ran short ({clause}): {tail}; its bench report says what resolves a few percent"]
    return []


def interrupted_note(side: str, path: str, d: dict) -> str | None:
    """The note when a file is a ``bench`` result interrupted after its last run (the only
    interrupted result compare reads): its runs are whole, the memcpy figure is not (None otherwise)."""
    if d.get("interrupted") is not True:
        return None
    return (f"{side} ({path}) was {d.get('error', 'interrupted')}: every run finished, so its figures compare; its "
            f"memcpy bandwidth and bandwidth ratio were not measured (run `ds4tui bench` to the end for them)")


def knob_change_warning(side: str, path: str, d: dict) -> str | None:
    """The warning when a run's DSpark knobs changed while it ran (a chat session's F2/F3/F7-F10,
    recorded as ``knob_events`` in a stats export or ``dspark_events`` in ``generate --json``, each the
    knobs from a cycle on): its counters mix the knobs before and after, and the knobs it records are
    those at its end, so "the same knobs" says nothing of its earlier cycles (None when none changed)."""
    # an export's events hold the knobs beside the cycle, generate's under "knobs"; knobs set from cycle 0
    # on (generate's flags, a key pressed before the first answer) were in force for every cycle counted
    def knobs_of(e: dict) -> dict:
        return e["knobs"] if isinstance(e.get("knobs"), dict) else {k: v for k, v in e.items() if k != "cycle"}

    events = [e for e in (d.get("knob_events") or d.get("dspark_events") or ()) if isinstance(e, dict)]
    at_end, in_force = d.get("knobs"), d.get("knobs_in_force")
    late = None
    if isinstance(at_end, dict) and isinstance(in_force, dict) and at_end != in_force:
        moved = ", ".join(f"{k} {json.dumps(v) if isinstance(v, bool) else _fmt(v)}" for k, v in at_end.items()
                          if in_force.get(k) != v)
        late = (f"{side} ({path}) had its DSpark knobs changed after its last cycle ({moved}): no cycle ran with "
                f"them, so compared are the knobs its cycles ran with")
    said, prev = [], None
    for e in events:
        knobs = knobs_of(e)
        moved = knobs if prev is None else {k: v for k, v in knobs.items() if prev.get(k) != v}
        prev = knobs
        if e.get("cycle") in (0, None) or not moved:
            continue
        said.append(f"from cycle {e['cycle']}: " + ", ".join(f"{k} {json.dumps(v) if isinstance(v, bool) else _fmt(v)}"
                                                             for k, v in moved.items()))
    if not said:
        return late
    more = f", and {len(said) - 4} more" if len(said) > 4 else ""
    compared = "those its last cycle ran with" if late else "those at its end"
    during = (f"{side} ({path}) changed its DSpark knobs while it ran ({'; '.join(said[:4])}{more}): its figures mix "
              f"the knobs before and after, and the knobs compared are {compared}; for an A/B, keep a run's knobs "
              f"fixed (in the chat, Ctrl+G starts a session whose counters start afresh)")
    return f"{late}. Also: {during}" if late else during


def same_run(path_a: str, path_b: str, a: dict, b: dict) -> str | None:
    """The note when A and B are one file, or two files holding the same run (equal JSON): then
    every figure is equal by construction, which says nothing about run-to-run noise."""
    try:
        one = os.path.samefile(path_a, path_b)
    except OSError:
        one = False
    if one:
        return (f"A and B are the same file ({path_a}): every figure is equal by construction; compare two runs "
                f"(the same command run twice, or with one knob changed)")
    if a == b:
        return (f"{path_a} and {path_b} hold the same run (equal contents, a copy of one result): every figure is "
                f"equal by construction; compare two runs")
    return None


def run(args) -> int:
    """``ds4tui compare A.json B.json [--json]``: exit status 0, or 1 when a file cannot be
    compared (:class:`CompareError`, named on stderr; with ``--json`` also ``{"ok": false}``)."""
    try:
        kind_a, a = load(args.a)
        kind_b, b = load(args.b)
    except CompareError as exc:
        print(f"{_PREFIX} error: {exc}", file=sys.stderr)
        if args.json:  # as every other command: the failure on stdout too
            print(json.dumps({"ok": False, "error": str(exc), "error_type": "CompareError"}))
        return 1
    same = kind_a == kind_b
    ra, rb = knobs_that_ran(a), knobs_that_ran(b)
    r = compare(canonical(kind_a, ra) if not same else ra, canonical(kind_b, rb) if not same else rb, same_kind=same)
    r["contains_warning"] = contains_warning(r["contains"], a.get("counters_id"))
    r["no_shared_figures"] = (None if r["figures"] or r["zero_in_both"]
                              else no_shared_figures(args.a, args.b, kind_a, kind_b, a, b))
    r["same_run"] = same_run(args.a, args.b, a, b)
    r["interrupted_notes"] = [n for n in (interrupted_note("A", args.a, a), interrupted_note("B", args.b, b)) if n]
    r["knob_change_warnings"] = [w for w in (knob_change_warning("A", args.a, a), knob_change_warning("B", args.b, b))
                                 if w]
    r["noise_notes"] = ([] if r["same_run"] or not r["figures"]  # no B/A to qualify
                        else noise_notes(args.a, args.b, kind_a, kind_b, a, b))
    if kind_a == kind_b == "bench-ab":
        r["arms"] = arm_tables(a, b)
    if args.json:
        print_whole(json.dumps({"ok": True, "a": args.a, "b": args.b, "kind_a": kind_a, "kind_b": kind_b, **r}, indent=1))
        # the table carries the warnings; with --json they also go to stderr, once each
        for w in (r["warning"], r["contains_warning"], *r["knob_change_warnings"]):
            if w:
                print(f"{_PREFIX} warning: {w}", file=sys.stderr)
        for note in (r["scheduler_start_note"], r["no_shared_figures"], r["same_run"], *r["interrupted_notes"],
                     *r["noise_notes"]):
            if note:
                print(f"{_PREFIX} note: {note}", file=sys.stderr)
    else:
        print(render(args.a, args.b, kind_a, kind_b, r, every_figure=getattr(args, "all", False)))
    return 0
