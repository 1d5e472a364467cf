"""The memory plan of ``ds4tui inspect --ctx N [--budget SIZE]`` ("will it fit", spec platform.md §2.2):
the session's bytes against the engine's own accounting, and the Flash plan against one worked by hand."""

from __future__ import annotations

import json

import pytest

from ds4tui.cli import main as cli_main
from ds4tui.engine import layout as L
from ds4tui.engine import memplan
from ds4tui.engine import session as S
from ds4tui.engine.gguf_model import DS4Model
from ds4tui.engine.synthetic import flash_config
from ds4tui.engine.telemetry import format_bytes

GIB = 1 << 30
FLASH_RATIOS = (0, 0) + tuple(4 if i % 2 == 0 else 128 for i in range(2, 43))
FLASH_SUPPORT = memplan.SupportShape(n_stages=3, block=5, rank=256, n_capture=3)  # spec dspark.md §2.1


@pytest.mark.parametrize("with_support", [False, True])
def test_session_bytes_are_what_the_engine_allocates(tiny_q2, with_support):
    """The oracle is the engine: ``Session.memory()`` after ``ds4_state_init`` on the CPU backend."""
    e = S.Engine(tiny_q2["model"], backend="cpu", n_threads=2, support=tiny_q2["support"] if with_support else None)
    try:
        shape, vec = None, memplan.vector_bytes(L.model_tensor_specs(e.config))
        if with_support:
            m = e.support.meta
            shape = memplan.SupportShape(m.n_stages, m.block_size, m.markov_rank, len(m.target_layer_ids))
            vec += memplan.vector_bytes(e.support.specs)
        for n_ctx in (40, 300, 4096):  # below the batch, above it, the default
            s = e.session(n_ctx)
            got = s.memory()
            s.close()
            want = memplan.session_bytes(e.config, n_ctx, support=shape, host=True, n_threads=e.n_threads)
            assert (got.kv, got.compressor) == (want["kv"], want["compressor"]), n_ctx
            assert got.scratch == want["scratch"] + want["host"] + vec, n_ctx
            assert got.weights == memplan.tensor_bytes(e.model, e.support)
    finally:
        e.close()


def test_flash_plan_against_a_hand_computed_one():
    """DS4 Flash (43 layers: 2 SWA, 21 CSA ratio 4, 20 HCA ratio 128; D 512, window 128) with its
    drafter on a GPU at 200K tokens, worked out buffer by buffer from spec ds4.md §1, §2.4, §2.8."""
    c = flash_config(FLASH_RATIOS)
    n = 200_000
    B = 2049  # a pass of 2048 tokens (a GPU session's default) + 1
    T = 256  # rows of an attention / indexer / LM-head tile
    kv = 43 * (128 + B) * 512 * 4  # raw rows: window + one pass, every layer
    cmp_cap = 2 * 128 + B  # two windows of the largest ratio + one pass
    csa = 2 * cmp_cap * 1024 * 4 + (n // 4 + 1) * 512 * 4 + 2 * cmp_cap * 256 * 4 + (n // 4 + 1) * 128 * 4
    hca = 2 * cmp_cap * 512 * 4 + (n // 128 + 1) * 512 * 4
    compressor = 21 * csa + 20 * hca
    keys = 128 + (n // 128 + 1)  # window + every HCA row (more than CSA's top_k 512 selected rows; even)
    keys += keys & 1
    per_row = (3 * 4 * 4096 + 24 + 4 + 4 + 16 + 2 * 4096 + 1024 + 64 * 512 + 512 + 64 * 512 + 8 * 1024 + 4096
               + 2 * 1024 + 64 * 128 + 64 + 256 + 6 + 2 * 6 * 2048 + 6 * 4096 + 2 * 2048 + 4096 + 4096 + 4
               + 4)  # floats per token of a pass: HC streams, attention, indexer, MoE
    ints_per_row = 1 + 512 + 1 + 6 + 8  # token, selected rows, their count, experts, output groups
    per_tile = 64 * keys + (n // 4 + 1) + 129280  # attention scores per head, indexer scores, logits
    drafter = 3 * (128 + B) * 4096 + 3 * (128 + B) * 512 + 128 * 4096 + 128 * 512 + 3 * 5 * 512 + 5 * 4096 \
        + 5 * 129280 + 129280 + 256 + 16  # ... the Markov row and feature, a greedy chain's 16 drafts
    picks = 2 * 17  # the greedy picks of a pass of up to 17 rows on the device: ids and non-finite flags
    scratch = 4 * (B * (per_row + ints_per_row) + 2 + T * per_tile + drafter + picks)  # + 2: the position word
    got = memplan.session_bytes(c, n, support=FLASH_SUPPORT)
    assert got["kv"] == kv == 191_715_328
    assert got["compressor"] == compressor
    assert got["scratch"] == scratch
    assert 1.95 * GIB < scratch < 2.05 * GIB and 3.15 * GIB < compressor < 3.25 * GIB
    # a 256-token batch (the CPU's default) at the same context: what the longer GPU pass adds
    short = memplan.session_bytes(c, n, n_batch=256, support=FLASH_SUPPORT)
    assert 2.0 * GIB < (got["scratch"] + got["compressor"] + got["kv"]) - (short["scratch"] + short["compressor"]
                                                                            + short["kv"]) < 2.6 * GIB

    # The real files on a 128 GB Strix Halo with ttm.pages_limit at 124 GiB of GTT.
    weights, support = 81_000_000_000, 5_600_000_000
    vec = memplan.vector_bytes(L.model_tensor_specs(c))
    plan = memplan.fit_plan(c, n, weights=weights, support_bytes=support, support=FLASH_SUPPORT,
                            fixed_scratch=vec, budget=124 * GIB, budget_source="--budget",
                            specs=L.model_tensor_specs(c))
    context = _native_defines()["GPU_Q8_PRE_BYTES"] + _native_defines()["ARGMAX_SCRATCH_BYTES"]
    assert plan.gemm == FLASH_GEMM
    assert plan.need == weights + support + kv + compressor + scratch + vec + context + FLASH_GEMM
    assert plan.fits and 86 * GIB < plan.need < 88 * GIB
    assert plan.max_ctx == c.context_length  # even the whole million-token context fits
    # the kernel's default GTT, half of the RAM: not even the weights fit
    half = memplan.fit_plan(c, n, weights=weights, support_bytes=support, support=FLASH_SUPPORT,
                            fixed_scratch=vec, budget=62 * GIB)
    assert half.fits is False and half.max_ctx is None
    # in between, the largest context is the last one whose plan fits
    mid = memplan.fit_plan(c, n, weights=weights, support_bytes=support, support=FLASH_SUPPORT,
                           fixed_scratch=vec, budget=96 * GIB)
    assert 200_000 < mid.max_ctx < c.context_length

    def need(k: int) -> int:
        return memplan.fit_plan(c, k, weights=weights, support_bytes=support, support=FLASH_SUPPORT,
                                fixed_scratch=vec).need

    assert need(mid.max_ctx) <= 96 * GIB < need(mid.max_ctx + 1)


#: The prefill GEMM's buffers at most for DS4 Flash at 2048-token passes (spec platform.md §7.1), by
#: hand (B = 2049 rows): the dequantised tile, 8 expert matrices of 2048 x 4096 (= the LM head's
#: 16384-row dense tile) in 16 bits; the rounded activations, the mHC control's 16384 columns x B rows
#: (more than a chunk of 8192 slot rows x 4096 columns); the float32 results of a chunk of the down
#: experts (8192 x 4096 rows); the slot lists: 256 used ids + 2 x (B x 6 slots + 8 x B padding rows).
FLASH_GEMM = 8 * 2048 * 4096 * 2 + 2049 * 16384 * 2 + 8192 * 4096 * 4 + (256 + 2 * (2049 * 6 + 8 * 2049)) * 4


def _native_defines() -> dict[str, int]:
    """The integer #defines of the GPU sources the plan mirrors, evaluated (casts dropped)."""
    import re
    from pathlib import Path

    native = Path(S.__file__).resolve().parent.parent / "native"
    text = "".join((native / f).read_text() for f in ("ds4_engine.h", "hip/gpu_internal.h", "hip/gemm.hip"))
    found: dict[str, int] = {}
    for name, expr in re.findall(r"^#define (\w+) (.+)$", text, re.M):
        expr = re.sub(r"\((?:size_t|int64_t)\)", "", re.sub(r"/\*.*?(\*/|$)", "", expr)).replace("/", "//")
        try:
            found[name] = int(eval(expr, {"__builtins__": {}}, dict(found)))
        except Exception:  # not an integer expression of earlier ones (a string, a macro with arguments)
            pass
    return found


def test_gemm_bytes_for_flash_against_a_hand_computed_bound():
    c = flash_config(FLASH_RATIOS)
    specs = L.model_tensor_specs(c)
    assert memplan.gemm_bytes(specs, 2049, c.n_expert_used, c.o_groups) == FLASH_GEMM == 335_807_600
    assert FLASH_GEMM < 0.32 * GIB  # what the README and spec ds4.md §2.8 say (0.31 GiB)
    # passes below the threshold never take the GEMM; longer passes take more (the dense rows, the chunk)
    assert memplan.gemm_bytes(specs, memplan.PREFILL_GEMM_MIN_ROWS - 1, c.n_expert_used, c.o_groups) == 0
    longer = memplan.gemm_bytes(specs, 8193, c.n_expert_used, c.o_groups)
    assert memplan.gemm_bytes(specs, 256, c.n_expert_used, c.o_groups) < FLASH_GEMM < longer


def test_gemm_bytes_counts_the_grouped_attention_output_as_a_gather():
    """attn_output_a goes through the gather path in o_groups matrices of n_rows slots each (no
    padding): where it is the largest product its lists, activations and results set the bound."""
    mat = L.TensorSpec("blk.0.attn_output_a.weight", (16 * 64, 4096), frozenset(), c_bind="mat")
    n = 3000
    dense = 2 * 64 * 4096 * 16 + n * 4096 * 2  # the whole matrix as one tile, the pass's rows
    assert memplan.gemm_bytes([mat], n, 6) == dense
    chunk = 8192  # 16 x 3000 slots, more than a chunk
    grouped = 16 * 64 * 4096 * 2 + chunk * 4096 * 2 + chunk * 64 * 4 + (16 + 2 * 16 * n) * 4
    assert memplan.gemm_bytes([mat], n, 6, 16) == grouped


def test_the_plans_constants_mirror_the_native_sources():
    """memplan's copies of GM_TILE_ELEMS, GM_CHUNK_ROWS, DS4_PREFILL_GEMM_MIN_ROWS and of the GPU
    context's own allocations (GPU_Q8_PRE_BYTES + ARGMAX_SCRATCH_BYTES) equal the C sources' values."""
    d = _native_defines()
    assert memplan.GEMM_TILE_ELEMS == d["GM_TILE_ELEMS"] == 64 << 20
    assert memplan.GEMM_CHUNK_ROWS == d["GM_CHUNK_ROWS"] == 8192
    assert memplan.PREFILL_GEMM_MIN_ROWS == d["DS4_PREFILL_GEMM_MIN_ROWS"] == S.PREFILL_GEMM_MIN_ROWS
    assert memplan.GPU_CONTEXT_BYTES == d["GPU_Q8_PRE_BYTES"] + d["ARGMAX_SCRATCH_BYTES"] == 733_952


def test_inspect_prints_the_plan_and_the_largest_context(tiny_q2, capsys):
    model, support = str(tiny_q2["model"]), str(tiny_q2["support"])
    rc = cli_main(["inspect", model, "--mtp", support, "--ctx", "8192", "--budget", "300MiB", "--json"])
    out = capsys.readouterr().out
    p = json.loads(out)["memory_plan"]
    assert rc == (0 if p["fits"] else 1)  # a plan that does not fit is a problem: status 1
    assert p["budget"] == 300 << 20 and p["budget_source"] == "--budget" and p["support_attached"]
    assert p["need"] == p["weights"] + p["support"] + p["kv"] + p["compressor"] + p["scratch"] + p["gemm"]
    model_specs = L.model_tensor_specs(DS4Model(model).config)
    cfg = DS4Model(model).config
    assert p["gemm"] == memplan.gemm_bytes(model_specs, 2049, cfg.n_expert_used, cfg.o_groups) > 0
    assert p["weights"] > 0 and p["support"] > 0 and p["fits"] == (p["need"] <= p["budget"])
    rc = cli_main(["inspect", model, "--mtp", support, "--ctx", "8192", "--budget", "300MiB"])
    text = capsys.readouterr().out
    assert rc == (0 if p["fits"] else 1) and "memory plan   on the GPU at context 8192 tokens:" in text
    assert "budget        300.0 MiB (--budget)" in text
    assert "GEMM" in text and "(the prefill GEMM's buffers at most" in text
    assert (f"largest ctx   {p['max_ctx']} tokens" in text) if p["max_ctx"] else "largest ctx   none" in text
    # the rows say which KV is which: the sliding window's ring (fixed rows) and the compressed KV (grows with
    # the context), apart from the KV read per decoded token above them; a legend says what each session row holds
    assert f"              KV window ring  {format_bytes(p['kv']):>12}\n" in text
    assert f"              compressed KV   {format_bytes(p['compressor']):>12}\n" in text
    assert f"              scratch         {format_bytes(p['scratch']):>12}\n" in text
    assert "              support model   " in text and "  (no support model given" not in text
    assert "KV cache " in text and ": the sliding window's rows, the compressed rows attended and the indexer keys " \
                                   "scanned)" in text
    assert "\nlegend        KV window ring: the sliding-window KV cache, every layer's raw KV rows in a ring of the " \
           "window plus one prefill pass (at most 2048 tokens); it stops growing once the context is longer than a " \
           "pass\n" in text
    assert ("\n              compressed KV:  the compressed KV rows and indexer keys of the whole context (CSA and HCA "
            "layers: what grows with the context), and the KV compressors' and indexer's rolling state (rings of two "
            "compression windows plus one pass)\n") in text
    assert ("\n              scratch:        a pass's activations and work buffers (sized by the batch, at most 2048 "
            "tokens), the attention and indexer scores and the logits of one 256-row tile (the scores grow with the "
            "context), the DSpark drafter's buffers, the float32 copies of norms and biases, the GPU context's own "
            "small buffers") in text
    assert "              KV  " not in text and "compressor " not in text  # the old, ambiguous row names


def test_the_plan_says_whether_a_support_model_was_given_or_refused(tiny_q2, tmp_path, capsys):
    """Without --mtp the support row says none was given and how to plan DSpark's memory; with a support
    model that is not compatible it says that one was given and why the plan leaves it out."""
    from ds4tui.devtools import make_test_model as mtm

    model = str(tiny_q2["model"])
    rc, out, err = _inspect(capsys, model, "--ctx", "64", "--budget", "1GiB")
    assert rc == 0, err
    assert ("              support model           none  (no support model given: add --mtp SUPPORT.gguf to plan "
            "DSpark's memory)\n") in out
    assert "NOT compatible" not in out and "DSpark drafter" not in out  # no drafter's buffers in its scratch
    no_support = json.loads(_inspect(capsys, model, "--ctx", "64", "--budget", "1GiB", "--json")[1])["memory_plan"]
    bad = mtm.write_support(tmp_path / "experts.gguf", mtm.tiny_config(), 0, types="f16", n_expert=8)
    rc, out, err = _inspect(capsys, model, "--mtp", str(bad), "--ctx", "64", "--budget", "1GiB")
    n = len(json.loads(_inspect(capsys, model, "--mtp", str(bad), "--ctx", "64", "--json")[1])["support"]["reasons"])
    assert rc == 1 and n > 0
    assert (f"              support model           none  (the support model given is NOT compatible: {n} problem(s), "
            f"listed above; the engine refuses it, so the plan leaves it out)\n") in out
    assert "no support model given" not in out
    refused = json.loads(_inspect(capsys, model, "--mtp", str(bad), "--ctx", "64", "--budget", "1GiB",
                                  "--json")[1])["memory_plan"]
    assert refused == no_support  # the refused support model changes no number of the plan


def test_a_bad_budget_is_one_line_naming_the_flag(tiny_q2, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["inspect", str(tiny_q2["model"]), "--budget", "lots"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert "--budget" in err and "'lots'" in err and "124GiB" in err


def _inspect(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = cli_main(["inspect", *argv])
    except SystemExit as exc:
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_budget_needs_a_unit(tiny_q2, capsys):
    for text in ("12", "1.5", "0"):
        rc, out, err = _inspect(capsys, str(tiny_q2["model"]), "--budget", text)
        assert rc == 2 and err == ("ds4tui inspect: error: argument --budget: expected a size with a unit such as "
                                   "124GiB, 128GB or 96G (units K/M/G/T = 1024^n, KB/MB/GB/TB = 1000^n, B = bytes), "
                                   f"found '{text}' (a bare number has no unit) (`ds4tui inspect --help` lists the "
                                   "options)\n")
    from ds4tui.cli import size_bytes

    assert size_bytes("12B") == 12 and size_bytes("1.5GiB") == 3 << 29 and size_bytes("2GB") == 2 * 10**9


def test_a_negative_budget_is_refused_by_name(tiny_q2, capsys):
    for argv in (["--budget", "-5GiB"], ["--budget=-5GiB"], ["--budget", "-5"]):
        text = "-5" if argv[-1] == "-5" else "-5GiB"
        rc, out, err = _inspect(capsys, str(tiny_q2["model"]), *argv)
        assert (rc, out) == (2, "") and err == (f"ds4tui inspect: error: argument --budget: expected a size of at least "
                                                f"1 byte, found '{text}' (a size cannot be negative: give the memory to "
                                                f"plan against, such as 124GiB) (`ds4tui inspect --help` lists the "
                                                f"options)\n")


def test_a_plan_that_does_not_fit_exits_1_and_says_what_does_not(tiny_q2, capsys):
    model, support = str(tiny_q2["model"]), str(tiny_q2["support"])
    rc, out, err = _inspect(capsys, model, "--mtp", support, "--budget", "1GiB", "--json")
    p = json.loads(out)["memory_plan"]
    fixed = p["weights"] + p["support"]
    # a budget between the weights + support and the smallest session: they fit, no session does
    between = fixed + 1
    rc, out, err = _inspect(capsys, model, "--mtp", support, "--ctx", "64", "--budget", f"{between}B")
    assert rc == 1, err
    from ds4tui.engine.telemetry import format_bytes as _gib

    r = json.loads(_inspect(capsys, model, "--mtp", support, "--ctx", "64", "--budget", f"{between}B", "--json")[1])
    assert r["ok"] is False and r["memory_plan"]["max_ctx"] is None
    need_at_1 = r["memory_plan"]["need_at_1"]
    assert fixed < need_at_1
    assert (f"largest ctx   none: the weights and support model fit ({_gib(fixed)}), but not with a session of even "
            f"1 token ({_gib(need_at_1)} in all)") in out
    assert f"verdict       does NOT fit: {_gib(r['memory_plan']['need'] - between)} short" in out
    rc, out, err = _inspect(capsys, model, "--budget", f"{p['weights'] - 1}B")
    assert rc == 1 and f"largest ctx   none: the weights alone ({_gib(p['weights'])}) do not fit" in out
    rc, out, err = _inspect(capsys, model, "--mtp", support, "--budget", "1GiB")
    assert rc == 0 and "verdict       fits" in out


def test_inspect_refuses_a_ctx_beyond_the_model(tiny_q2, capsys):
    model = str(tiny_q2["model"])
    limit = DS4Model(model).config.context_length
    rc, out, err = _inspect(capsys, model, "--ctx", str(limit + 1))
    assert rc == 2 and out == "" and err == (f"ds4tui inspect: error: argument --ctx: expected 1..{limit} (the "
                                             f"context length of {model}), found {limit + 1}\n")


def test_the_no_gpu_budget_line_has_no_nested_parentheses(tmp_path):
    budget, why = memplan.gpu_budget(sysfs_root=tmp_path, proc_root=tmp_path, ttm_root=tmp_path,
                                     probe=lambda lib: (None, "no device: no driver (the runtime says: x)"))
    assert budget is None and why == "no GPU memory size known: no device: no driver (the runtime says: x); give --budget SIZE"


def test_a_gpu_whose_runtime_gives_no_total_is_named_in_the_no_budget_line(tmp_path):
    """A GPU found without a memory total was 'no memory numbers', which read as no GPU found."""
    from ds4tui.engine.gpu import GPUInfo

    info = GPUInfo(library="libds4tui_cuda.so", platform="cuda", built_arch="sm_90", runtime_version=0,
                   driver_version=0, n_devices=1, device=0, device_name="NVIDIA H200", device_arch="sm_90",
                   warp_size=32, arch_ok=True, mem_total=0, mem_free=0)
    budget, why = memplan.gpu_budget(sysfs_root=tmp_path, proc_root=tmp_path, ttm_root=tmp_path,
                                     probe=lambda lib: (info, ""))
    assert budget is None and why == ("no GPU memory size known: the CUDA runtime found device 0 (NVIDIA H200) but "
                                      "gives no memory total for it; give --budget SIZE")
