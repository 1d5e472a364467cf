"""``ds4tui inspect MODEL [--mtp SUPPORT] [--ctx N] [--budget SIZE] [--json]``: summary and validation of
DS4 / DSpark GGUFs, and the memory plan: does the model (with its support model) fit the GPU at
``--ctx`` tokens, and what is the largest context that does (:func:`ds4tui.engine.memplan.fit_plan`).

Exit status: 0 when everything is valid and the plan fits (or no budget is known), 1 for a bad
file, an incompatible support model or a plan that does not fit the budget, 2 for a usage error
(``--ctx`` beyond the model's context length, a ``--budget`` without a unit)."""

from __future__ import annotations

import json
import sys

from ds4tui.commands.environment import argument_hint
from ds4tui.engine import layout as L
from ds4tui.engine import memplan
from ds4tui.engine.draft_vocab import DraftVocabError, resolve as resolve_draft_vocab
from ds4tui.engine.gguf_model import DS4Model, ModelFileError, SupportModel
from ds4tui.engine.telemetry import format_bytes, plural
from ds4tui.engine.tokenizer import Tokenizer, TokenizerError
from ds4tui.interrupts import print_whole


def _schedule_text(schedule: list[dict]) -> str:
    """Run-length text of the layer schedule, e.g. ``0-1 SWA/hash  2 CSA(4)/hash  3 HCA(16)/topk ...``."""
    parts, start = [], 0
    for i in range(1, len(schedule) + 1):
        if i == len(schedule) or (schedule[i]["attention"], schedule[i]["compress_ratio"], schedule[i]["moe"]) != (
                schedule[start]["attention"], schedule[start]["compress_ratio"], schedule[start]["moe"]):
            s = schedule[start]
            span = f"{start}" if i - 1 == start else f"{start}-{i - 1}"
            ratio = f"({s['compress_ratio']})" if s["compress_ratio"] else ""
            parts.append(f"{span} {s['attention']}{ratio}/{s['moe']}")
            start = i
    return "  ".join(parts)


def render_text(model: dict, support: dict | None) -> str:
    d = model["dims"]
    lines = [
        f"model         {model['path']}",
        f"name          {model['name']}",
        f"architecture  {model['architecture']}  ({model['n_tensors']} tensors, {format_bytes(model['file_bytes'])} on disk)",
        f"dims          layers {d['n_layer']}  hidden {d['n_embd']}  vocab {d['n_vocab']}  heads {d['n_head']}x"
        f"{d['head_dim']} (rope {d['n_rot']})  q_lora {d['q_lora_rank']}  out {d['o_groups']}x{d['o_lora_rank']}",
        f"moe           {d['n_expert']} experts, {d['n_expert_used']} used, {d['n_expert_shared']} shared, "
        f"ff {d['n_ff_exp']}; {plural(d['n_hash_layer'], 'hash layer')}",
        f"attention     window {d['sliding_window']}  indexer {d['indexer_n_head']}x{d['indexer_head_dim']} "
        f"top-{d['indexer_top_k']}  HC {d['hc_count']}  context {d['context_length']}",
    ]
    c = model["layer_counts"]
    lines.append(f"layers        {c['SWA']} SWA, {c['CSA']} CSA, {c['HCA']} HCA; {c['hash_moe']} hash-MoE, "
                 f"{c['topk_moe']} top-k MoE")
    lines.append(f"schedule      {_schedule_text(model['schedule'])}")
    lines.append("quant mix     type      tensors        bytes")
    for t, m in model["quant_mix"].items():
        lines.append(f"              {t:<8} {m['tensors']:>8} {m['bytes']:>12}  ({format_bytes(m['bytes'])})")
    lines.append(f"total         {model['tensor_bytes']} bytes of tensor data ({format_bytes(model['tensor_bytes'])})")
    b = model["bytes_per_token"]
    lines.append(f"per token     ~{format_bytes(b['total'])} read per decoded token at context {model['ctx']} "
                 f"(weights {format_bytes(b['weights'])}, KV cache {format_bytes(b['kv'])}: the sliding window's rows, "
                 f"the compressed rows attended and the indexer keys scanned)")
    for w in model["warnings"]:
        lines.append(f"warning       {w}")
    if support is not None:
        counts = " ".join(f"{k}={v}" for k, v in support["counts"].items())
        lines.append("")
        lines.append(f"support       {support['path']}  ({support['architecture']}, {format_bytes(support['tensor_bytes'])})")
        lines.append(f"              {counts}")
        lines.append(f"              capture layers {support['target_layer_ids']}  noise token {support['noise_token_id']}")
        dv = support.get("draft_vocab")
        if dv is not None:  # spec dspark.md §2.6
            lines.append(f"              draft vocabulary {dv['size']} tokens ({dv['key']})" if not dv["problem"]
                         else f"              draft vocabulary ({dv['key']}) cannot be used: {dv['problem']}")
        if support["compatible"]:
            lines.append("verdict       compatible: DSpark can draft with this support model")
        else:
            lines.append(f"verdict       NOT compatible ({len(support['reasons'])} problem(s)):")
            lines += [f"              - {r}" for r in support["reasons"]]
    return "\n".join(lines)


def draft_vocab_rows(support: SupportModel, n_vocab: int) -> int:
    """The draft-vocabulary rows the engine copies for ``support`` under ``--draft-vocab auto`` (spec
    dspark.md §2.6; 0: it drafts from the whole vocabulary, or the file's list is unusable)."""
    try:
        return len(resolve_draft_vocab("auto", support, n_vocab)[0])
    except DraftVocabError:
        return 0


def memory_plan(model: DS4Model, support: SupportModel | None, ctx: int, budget: int | None) -> dict:
    """The GPU memory plan of ``model`` (+ a compatible ``support``) at ``ctx`` tokens against
    ``budget`` bytes (None: the GPU's, :func:`memplan.gpu_budget`); a support model that is not
    compatible is left out (the engine refuses it, so nothing of it is uploaded)."""
    specs = L.model_tensor_specs(model.config)
    shape, sup_bytes, dv_rows, vec = None, 0, 0, memplan.vector_bytes(specs)
    attached = support is not None and support.summary()["compatible"]
    if attached:
        m = support.meta
        shape = memplan.SupportShape(m.n_stages, int(m.block_size), int(m.markov_rank), len(m.target_layer_ids))
        dv_rows = draft_vocab_rows(support, model.config.n_vocab)
        sup_bytes = memplan.tensor_bytes(support) + memplan.draft_vocab_bytes(model, support, dv_rows)
        vec += memplan.vector_bytes(support.specs)
    source = "--budget"
    if budget is None:
        budget, source = memplan.gpu_budget()
    plan = memplan.fit_plan(model.config, ctx, weights=memplan.tensor_bytes(model), support_bytes=sup_bytes,
                            support=shape, fixed_scratch=vec, budget=budget, budget_source=source, specs=specs)
    d = plan.to_dict()
    d["support_attached"] = attached
    d["draft_vocab_rows"] = dv_rows
    if budget is not None and plan.max_ctx is None:  # what the smallest session would need
        d["need_at_1"] = memplan.fit_plan(model.config, 1, weights=memplan.tensor_bytes(model), support_bytes=sup_bytes,
                                          support=shape, fixed_scratch=vec, specs=specs).to_dict()["need"]
    return d


#: The plan's rows: (label, key of the plan); the label column's width.
PLAN_ROWS = (("weights", "weights"), ("support model", "support"), ("KV window ring", "kv"),
             ("compressed KV", "compressor"), ("scratch", "scratch"), ("GEMM", "gemm"))
_LABEL = 16


def _support_none_note(support: dict | None) -> str:
    """Why the plan has no support model: none was given (``support`` None), or the one given is not
    compatible (its summary: the engine refuses it, so nothing of it is uploaded)."""
    if support is None:
        return "no support model given: add --mtp SUPPORT.gguf to plan DSpark's memory"
    n = len(support.get("reasons") or ())
    return (f"the support model given is NOT compatible: {n} problem(s), listed above; the engine refuses it, "
            f"so the plan leaves it out")


def plan_legend(p: dict) -> list[tuple[str, str]]:
    """What the plan's session rows hold (memplan.session_bytes and fit_plan): (label, one line) each."""
    batch, tile = memplan.GPU_DEFAULT_BATCH, memplan.PASS_TILE_ROWS
    drafter = ", the DSpark drafter's buffers" if p["support_attached"] else ""
    return [
        ("KV window ring", f"the sliding-window KV cache, every layer's raw KV rows in a ring of the window plus one "
                           f"prefill pass (at most {batch} tokens); it stops growing once the context is longer than "
                           f"a pass"),
        ("compressed KV", "the compressed KV rows and indexer keys of the whole context (CSA and HCA layers: what grows "
                          "with the context), and the KV compressors' and indexer's rolling state (rings of two "
                          "compression windows plus one pass)"),
        ("scratch", f"a pass's activations and work buffers (sized by the batch, at most {batch} tokens), the attention "
                    f"and indexer scores and the logits of one {tile}-row tile (the scores grow with the context)"
                    f"{drafter}, the float32 copies of norms and biases, the GPU context's own small buffers"),
    ]


def render_plan(p: dict, support: dict | None = None) -> str:
    """The memory plan as text: one line per part, the total against the budget, the verdict, and a
    legend of the session rows.  ``support``: the support model's summary when one was given (None:
    no ``--mtp``), to say why the plan has none when it is not compatible."""
    lines = [f"memory plan   on the GPU at context {p['n_ctx']} tokens:"]
    for label, key in PLAN_ROWS:
        if key == "support" and not p["support_attached"]:
            lines.append(f"              {label:<{_LABEL}}{'none':>12}  ({_support_none_note(support)})")
            continue
        line = f"              {label:<{_LABEL}}{format_bytes(p[key]):>12}"
        if key == "support" and p.get("draft_vocab_rows"):
            line += f"  (with the draft vocabulary's {p['draft_vocab_rows']} row copies)"
        elif key == "gemm":
            line += ("  (the prefill GEMM's buffers at most: --prefill-gemm auto uses them where cuBLAS or rocBLAS "
                     "loads; the library's own workspace aside)")
        lines.append(line)
    lines.append(f"              {'total':<{_LABEL}}{format_bytes(p['need']):>12}")
    legend = [f"{'legend' if i == 0 else '':<14}{label + ':':<{_LABEL}}{text}"
              for i, (label, text) in enumerate(plan_legend(p))]
    if p["budget"] is None:
        lines.append(f"budget        unknown: {p['budget_source']}")
        return "\n".join(lines + legend)
    lines.append(f"budget        {format_bytes(p['budget'])} ({p['budget_source']})")
    left = p["budget"] - p["need"]
    if p["fits"]:
        lines.append(f"verdict       fits, {format_bytes(left)} to spare")
    else:
        lines.append(f"verdict       does NOT fit: {format_bytes(-left)} short")
    if p["max_ctx"] is None:
        fixed = p["weights"] + (p["support"] if p["support_attached"] else 0)
        if fixed > p["budget"]:
            what = "the weights and the support model" if p["support_attached"] else "the weights"
            lines.append(f"largest ctx   none: {what} alone ({format_bytes(fixed)}) do not fit")
        else:
            what = "weights and support model" if p["support_attached"] else "weights"
            lines.append(f"largest ctx   none: the {what} fit ({format_bytes(fixed)}), but not with a session of even "
                         f"1 token ({format_bytes(p['need_at_1'])} in all)")
    elif p["max_ctx"] >= p["context_length"]:
        lines.append(f"largest ctx   {p['max_ctx']} tokens (the model's whole context length)")
    else:
        lines.append(f"largest ctx   {p['max_ctx']} tokens fit")
    return "\n".join(lines + legend)


def run(args) -> int:
    loading_support = False
    try:
        model = DS4Model(args.model, check_finite=args.check_finite)
        Tokenizer.from_gguf(model.reader)  # the tokenizer.ggml.* keys and ids, checked as generate reads them
        loading_support = args.mtp is not None
        support = SupportModel(args.mtp, model.config) if args.mtp else None
    except (ModelFileError, TokenizerError) as exc:
        # the support file's error names --mtp and what it expects, as generate, chat and bench say it
        # (MODEL's hint there offers the demo, which inspect has not: its own errors stay as they are;
        # decided by which load failed, not by the path: MODEL and --mtp may name the same file)
        message = str(exc) + (argument_hint(exc, None, args.mtp) if loading_support else "")
        if args.json:
            print(json.dumps({"ok": False, "error": message, "error_type": type(exc).__name__}))
        print(f"ds4tui inspect: error: {message}", file=sys.stderr)
        return 1
    limit = model.config.context_length
    if args.ctx > limit:  # refused as generate and chat refuse it: a usage error, status 2
        message = f"argument --ctx: expected 1..{limit} (the context length of {args.model}), found {args.ctx}"
        if args.json:
            print(json.dumps({"ok": False, "error": message}))
        print(f"ds4tui inspect: error: {message}", file=sys.stderr)
        return 2
    ms = model.summary(ctx=args.ctx)
    ss = support.summary() if support is not None else None
    # a support file's draft vocabulary that cannot be used is a problem too (spec dspark.md §2.6)
    ok = ss is None or (ss["compatible"] and not (ss.get("draft_vocab") or {}).get("problem"))
    plan = memory_plan(model, support, args.ctx, getattr(args, "budget", None))
    # a plan that does not fit the budget is a problem: exit status 1, as the README says of any
    fits = plan["budget"] is None or plan["fits"]
    scanned = {"tensors": len(model.specs), "nonfinite": 0} if args.check_finite else None  # else it raised
    if args.json:
        out = {"ok": ok and fits, "model": ms, "support": ss, "memory_plan": plan, "check_finite": scanned}
        if not fits:
            out["error"] = f"the plan at context {args.ctx} does not fit the budget: {format_bytes(plan['need'] - plan['budget'])} short"
        print_whole(json.dumps(out, indent=2))
    else:
        print(render_text(ms, ss))
        if scanned is not None:
            print(f"finite        all {scanned['tensors']} tensors scanned (float values and block scales): "
                  f"no NaN/Inf")
        print()
        print(render_plan(plan, ss))
    return 0 if ok and fits else 1
