"""The native CPU engine against the numpy reference (the oracle; spec ds4.md §6).

Tolerances.  In ``transformers`` numerics the engine and the reference differ only by float32
summation order (row-blocked dot products vs BLAS, softmax sums): measured ≤ 1.1e-5 on logits with
std ≈ 2.4, bound 1e-4 at every position.

In ``ds4`` numerics KV rows go through E4M3 (3 mantissa bits) and f16, and indexer rows through
FP4, so a lane that sits on a rounding boundary can land one step away (an E4M3 step is up to 12%
of the lane): measured ≤ 1.2e-3 at almost every position, bound 1e-2 — the bound the reference
holds between its own prefill and decode paths.  Such a step can also tip a discrete choice that
was close: on the q2 model with this prompt, position 73's layer-4 router has a 1.3e-3 gap between
its 6th and 7th expert, the engine picks the other expert and that position's logits move by 0.12
(later positions stay within 1e-2).  So in ``ds4`` numerics at most ``MAX_FLIPS`` positions may
exceed the bound; transformers numerics, which has no rounding steps, allows none.  Greedy tokens
must agree wherever the reference's top-2 gap exceeds twice the bound.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ds4tui.engine import reference as R
from ds4tui.engine import session as S
from ds4tui.engine.gguf_model import DS4Model

TOL = {"transformers": 1e-4, "ds4": 1e-2}
MAX_FLIPS = {"transformers": 0, "ds4": 2}
N_PROMPT = 230


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return np.random.default_rng(11).integers(0, 129280, N_PROMPT).tolist()


@pytest.fixture(scope="module", params=[("tiny_q2", "ds4"), ("tiny_q2", "transformers"), ("tiny_f32", "ds4"),
                                        ("tiny_f32", "transformers")], ids=lambda p: f"{p[0]}-{p[1]}")
def case(request, prompt):
    """Reference one-shot logits of the prompt and the native engine for one (model, numerics)."""
    name, numerics = request.param
    paths = request.getfixturevalue(name)
    ref = R.ReferenceModel(paths["model"], numerics=numerics)
    st = ref.new_state(1024)
    full = ref.forward(st, prompt, logits="all").logits
    eng = S.Engine(paths["model"], numerics=numerics)
    return {"name": name, "numerics": numerics, "ref": ref, "full": full, "engine": eng, "tol": TOL[numerics]}


def _check_rows(got: np.ndarray, want: np.ndarray, case) -> np.ndarray:
    """Assert the per-position bound (with the allowed rounding flips); returns the in-bound mask."""
    err = np.abs(got - want).max(axis=1)
    ok = err < case["tol"]
    flips = np.nonzero(~ok)[0]
    assert flips.size <= MAX_FLIPS[case["numerics"]], \
        f"{flips.size} positions beyond {case['tol']}: {flips[:10]} (errors {err[flips][:10]})"
    assert np.median(err) < case["tol"] / 10
    return ok


def _decided(logits: np.ndarray, tol: float) -> np.ndarray:
    """Positions whose top-2 gap exceeds 2·tol (the greedy token there is not a rounding question)."""
    top2 = np.sort(logits, axis=1)[:, -2:]
    return (top2[:, 1] - top2[:, 0]) > 2 * tol


def test_prefill_logits_match_reference_at_every_position(case, prompt):
    s = case["engine"].session(1024, n_batch=64)
    got = s.prefill(prompt, logits="all")
    assert got.shape == (N_PROMPT, 129280)
    ok = _check_rows(got, case["full"], case)
    dec = _decided(case["full"], case["tol"]) & ok
    assert dec.mean() > 0.9
    assert np.array_equal(got.argmax(1)[dec], case["full"].argmax(1)[dec])
    assert s.n_tokens == N_PROMPT and s.tokens == prompt


def test_decode_logits_match_reference_at_every_position(case, prompt):
    """One token per forward pass (the decode path) for the whole prompt; the engine is
    batch-invariant, so these rows are bit-identical to a chunked prefill's."""
    s = case["engine"].session(1024, n_batch=64)
    rows = np.stack([s.prefill([t]) for t in prompt])
    _check_rows(rows, case["full"], case)
    assert np.array_equal(rows, case["engine"].session(1024, n_batch=64).prefill(prompt, logits="all"))


def test_greedy_continuation_of_100_tokens_matches_reference(case, prompt):
    if (case["name"], case["numerics"]) == ("tiny_f32", "transformers"):
        pytest.skip("covered by the three other model/numerics pairs (keeps CI time down)")
    want = R.greedy_generate(case["ref"], prompt, 100, n_ctx=1024)
    s = case["engine"].session(1024, n_batch=64)
    got = list(s.generate(prompt, max_tokens=100))
    assert got == want
    st = s.stats()
    assert st.n_decode_tokens == 100 and st.n_steps == 100
    assert st.n_prefill_tokens == N_PROMPT
    assert st.n_target_evals == 4 + 99  # four 64-token chunks, then 99 steps that run the pending token
    assert s.n_tokens == N_PROMPT + 99 and s.pending == got[-1]


def test_odd_chunks_and_batch_sizes_agree(case, prompt):
    s = case["engine"].session(1024, n_batch=37)
    got = s.prefill(prompt, logits="all", chunk=29)
    _check_rows(got, case["full"], case)


@pytest.mark.parametrize("numerics", ["ds4", "transformers"])
def test_passes_longer_than_a_tile_equal_short_chunks(tiny_q2, numerics):
    """Attention, the indexer and the LM head run in tiles of 256 rows inside a pass (spec ds4.md
    §2.8): a 600-token pass (three tiles, the indexer selecting past top_k) gives the same logits,
    bit for bit, as 64-token chunks, whose rows the reference tests above check."""
    long_prompt = np.random.default_rng(12).integers(0, 129280, 600).tolist()
    e = S.Engine(tiny_q2["model"], numerics=numerics)
    try:
        one = e.session(1024, n_batch=600).prefill(long_prompt, logits="all")
        chunked = e.session(1024, n_batch=64).prefill(long_prompt, logits="all")
        assert one.shape == (600, 129280) and np.isfinite(one).all()
        assert np.array_equal(one, chunked)
    finally:
        e.close()


def test_default_batch_is_the_backend_s_prefill_chunk(eng):
    """``Engine.session`` without n_batch: the backend's chunk (S.DEFAULT_BATCH: a GPU 2048, the CPU
    256), at most the context; an explicit n_batch is kept as given."""
    assert S.DEFAULT_BATCH["hip"] == 2048 and S.DEFAULT_BATCH.get("cpu", S.DEFAULT_BATCH_OTHER) == 256
    assert eng.session(1024).n_batch == 256 and eng.session(100).n_batch == 100
    assert eng.session(100, n_batch=300).n_batch == 300


def test_ds4_numerics_are_really_on(tiny_q2, prompt):
    """The ds4 roundings move logits far more than the engine/reference gap (spec ds4.md §2.9)."""
    ds4 = S.Engine(tiny_q2["model"], numerics="ds4").session(512).prefill(prompt[:120], logits="all")
    tf = S.Engine(tiny_q2["model"], numerics="transformers").session(512).prefill(prompt[:120], logits="all")
    assert np.abs(ds4 - tf).max() > 0.05


# ---- one model, many behaviours ----------------------------------------------------------------

@pytest.fixture(scope="module")
def eng(tiny_q2):
    return S.Engine(tiny_q2["model"])


@pytest.fixture(scope="module")
def ref_q2(tiny_q2):
    return R.ReferenceModel(tiny_q2["model"])


@pytest.mark.parametrize("activations", ["f32", "q8"])
def test_threads_do_not_change_results(tiny_q2, prompt, activations):
    """A prefill in chunks and a 6-row pass after it (a verify's shape) give the same floats with 1, 2
    and 3 threads: the products, the expert groups and the row-wise ops split over the pool without
    changing a result."""
    outs = []
    for n in (1, 2, 3):
        e = S.Engine(tiny_q2["model"], n_threads=n, activations=activations)
        assert e.n_threads == n
        s = e.session(512, n_batch=64)
        pre = s.prefill(prompt[:100], logits="all")
        outs.append((pre, s.prefill(prompt[100:106], logits="all")))
    assert outs[0][1].shape == (6, 129280) and np.isfinite(outs[0][1]).all()
    for pre, six in outs[1:]:
        assert np.array_equal(outs[0][0], pre) and np.array_equal(outs[0][1], six)


def test_a_long_decode_splits_the_indexer_keys_over_the_threads_with_the_same_floats(tiny_q2):
    """Past 256 compressed rows a pass of fewer tokens than threads (a decode) scores the indexer's
    keys on every thread instead of one thread a token (cpu/backend.c `indexer`): three decodes after
    a 1100-token prompt (275 rows of the ratio-4 layer) give the same floats with 1, 2 and 3 threads."""
    ids = np.random.default_rng(5).integers(0, 129280, 1100).tolist()
    outs = []
    for n in (1, 2, 3):
        e = S.Engine(tiny_q2["model"], n_threads=n)
        s = e.session(1200, n_batch=256)
        s.prefill(ids, logits="none")
        outs.append(np.stack([s.prefill([t]) for t in (17, 4242, 99)]))
        e.close()
    assert outs[0].shape == (3, 129280) and np.isfinite(outs[0]).all()
    for o in outs[1:]:
        assert np.array_equal(outs[0], o)


def test_pending_token_runs_before_the_next_prefill(eng, ref_q2, prompt):
    """Multi-turn: step() emits a token; the next prefill runs it first, then the new tokens."""
    s = eng.session(512)
    s.prefill(prompt[:50])
    tok = s.step()[0]
    assert s.pending == tok and s.n_tokens == 50
    got = s.prefill(prompt[50:80], logits="all")
    assert s.tokens == prompt[:50] + [tok] + prompt[50:80] and s.pending is None
    st = ref_q2.new_state(512)
    want = ref_q2.forward(st, prompt[:50] + [tok] + prompt[50:80], logits="all").logits[51:]
    assert got.shape == (30, 129280)
    assert np.abs(got - want).max() < 1e-2


def test_truncate_rolls_back_exactly(eng, prompt):
    s = eng.session(512, n_batch=64)
    a = s.prefill(prompt[:120], logits="all")
    s.prefill(prompt[120:160])
    s.truncate(100)
    assert s.n_tokens == 100
    b = s.prefill(prompt[100:120], logits="all")
    assert np.array_equal(a[100:120], b)
    with pytest.raises(ValueError, match="at most 64"):
        s.truncate(20)
    s.truncate(0)
    assert np.array_equal(s.prefill(prompt[:30], logits="all"), a[:30])


def test_cancel_between_chunks_returns_promptly_and_session_stays_usable(eng, ref_q2, prompt):
    long = (prompt * 3)[:600]
    s = eng.session(1024, n_batch=64)
    started = threading.Event()
    box: dict = {}

    def work():
        try:
            s.prefill(long, chunk=8, progress=lambda done, total: started.set())
        except S.CancelledError as exc:
            box["exc"] = exc
            box["t"] = time.perf_counter()

    th = threading.Thread(target=work)
    th.start()
    assert started.wait(30)
    t0 = time.perf_counter()
    s.cancel()
    th.join(30)
    assert not th.is_alive()
    assert "exc" in box, "the prefill finished instead of being cancelled"
    assert box["t"] - t0 < 2.0  # one 8-token chunk is ~50 ms; the whole prefill takes seconds
    assert s.n_tokens == box["exc"].kept and s.pending is None
    assert s.stats().n_cancelled in (0, 1)
    s.reset()
    got = s.prefill(prompt[:60], logits="all")
    want = ref_q2.forward(ref_q2.new_state(512), prompt[:60], logits="all").logits
    assert np.abs(got - want).max() < 1e-2


def test_cancel_inside_a_forward_pass_leaves_the_session_unchanged(eng, ref_q2, prompt):
    """The C engine checks the cancel flag at every layer: a pending cancel stops the next pass."""
    from ds4tui._native import ffi, lib

    s = eng.session(512, n_batch=64)
    s.prefill(prompt[:40])
    lib.ds4_session_cancel(s.backend.handle)
    with pytest.raises(S.CancelledError):
        s.backend.eval(prompt[40:60], "all", None)
    assert lib.ds4_session_n_tokens(s.backend.handle) == 40 and s.stats().n_cancelled == 1
    got = s.backend.eval(prompt[40:60], "all", None)
    want = ref_q2.forward(ref_q2.new_state(512), prompt[:60], logits="all").logits[40:]
    assert np.abs(got - want).max() < 1e-2
    assert ffi.string(lib.ds4_version()).startswith(b"ds4tui-native")


def test_context_overflow_is_a_clear_error_and_loses_nothing(eng, prompt):
    s = eng.session(50)
    with pytest.raises(S.ContextOverflowError, match=r"0 tokens in the session \+ 60 new > context size 50"):
        s.prefill(prompt[:60])
    assert s.n_tokens == 0
    s.prefill(prompt[:48])
    s.step()  # pending token 49
    s.step()  # runs it: 49 in the cache, a new pending one
    assert s.n_tokens == 49
    s.step()
    assert s.n_tokens == 50
    with pytest.raises(S.ContextOverflowError, match="context size 50"):
        s.step()
    assert s.n_tokens == 50 and s.pending is not None


def test_zero_length_prompt_is_refused_without_crashing(eng):
    from ds4tui._native import ffi, lib

    s = eng.session(64)
    with pytest.raises(ValueError, match="empty prompt"):
        s.prefill([])
    err = ffi.new("char[256]")
    logits = np.empty(129280, np.float32)
    rc = lib.ds4_session_eval(s.backend.handle, ffi.NULL, 0, 1, ffi.cast("float *", ffi.from_buffer(logits)), err, 256)
    assert rc == lib.DS4_E_INVALID and b"empty prompt" in ffi.string(err)
    assert lib.ds4_session_eval(s.backend.handle, ffi.NULL, 0, 0, ffi.NULL, err, 256) == lib.DS4_OK
    with pytest.raises(S.StateError, match="evaluate a prompt first"):
        s.step()


def test_bad_token_ids_are_refused_before_anything_runs(eng):
    s = eng.session(64)
    with pytest.raises(S.TokenRangeError, match="129280 at index 1"):
        s.prefill([5, 129280])
    with pytest.raises(TypeError):
        s.prefill([1.5])
    assert s.n_tokens == 0 and s.stats().n_prefill_tokens == 0


def test_sampling_is_seeded_and_top_k_1_is_greedy(eng, prompt):
    def run(params):
        s = eng.session(512)
        s.set_sampling(params)
        return list(s.generate(prompt[:40], max_tokens=20))

    greedy = run(S.SamplingParams())
    assert run(S.SamplingParams(temperature=0.8, top_k=1, seed=3)) == greedy
    a = run(S.SamplingParams(temperature=1.5, seed=7))
    assert a == run(S.SamplingParams(temperature=1.5, seed=7))
    assert a != run(S.SamplingParams(temperature=1.5, seed=8))
    with pytest.raises(ValueError, match="top_p"):
        S.SamplingParams(top_p=0).validate()


def test_reference_backend_runs_through_the_same_interface(tiny_q2, eng, prompt):
    r = S.Engine(tiny_q2["model"], backend="reference")
    got_ref = list(r.session(512).generate(prompt[:40], max_tokens=8))
    got_cpu = list(eng.session(512).generate(prompt[:40], max_tokens=8))
    assert got_ref == got_cpu
    p = S.SamplingParams(temperature=0.7, top_p=0.9, seed=5)
    rs, cs = r.session(512), eng.session(512)
    rs.set_sampling(p)
    cs.set_sampling(p)
    assert list(rs.generate(prompt[:40], max_tokens=8)) == list(cs.generate(prompt[:40], max_tokens=8))


def test_memory_accounting(tiny_q2, eng):
    m = DS4Model(tiny_q2["model"])
    c = m.config
    s = eng.session(256, n_batch=32)
    mem = s.memory()
    assert mem.weights == sum(t.nbytes for t in m.tensors.values())
    assert mem.kv == c.n_layer * (c.sliding_window + 33) * c.head_dim * 4
    comp_layers = [i for i in range(c.n_layer) if c.compress_ratios[i]]
    assert mem.compressor > sum((256 // c.compress_ratios[i] + 1) * c.head_dim * 4 for i in comp_layers)
    assert mem.scratch > 0 and mem.device == 0
    assert mem.total == mem.weights + mem.kv + mem.compressor + mem.scratch


def test_descriptor_errors_name_the_tensor(tiny_q2, monkeypatch, tmp_path):
    m = DS4Model(tiny_q2["model"])
    del m.tensors["blk.1.attn_q_a.weight"]
    with pytest.raises(S.EngineError, match=r"tensor 'blk\.1\.attn_q_a\.weight' is missing"):
        S.Engine(m)
    missing = tmp_path / "no-gpu-library.so"  # also on a machine with a GPU
    with pytest.raises(S.BackendUnavailableError, match=r"the GPU backend \(--backend hip\) is unavailable: GPU library .*no-gpu-library"):
        S.Engine(tiny_q2["model"], backend="hip", gpu_library=missing)
    with pytest.raises(ValueError, match="numerics"):
        S.Engine(tiny_q2["model"], numerics="fast")
    with pytest.raises(ValueError, match="gpu_layout must be one of planar, ggml, got 'tiled'"):
        S.Engine(tiny_q2["model"], gpu_layout="tiled")
    with pytest.raises(ValueError, match="prefill_gemm must be one of off, bf16, f16, auto, got 'int8'"):
        S.Engine(tiny_q2["model"], prefill_gemm="int8")


def test_gpu_graphs_is_a_named_option_off_where_nothing_is_launched(tiny_q2):
    """Spec platform.md §8: the cpu and reference backends launch no kernels, so graphs are off there
    and the note says why; a bad value is refused by name."""
    with pytest.raises(ValueError, match="gpu_graphs must be one of off, on, got 'yes'"):
        S.Engine(tiny_q2["model"], gpu_graphs="yes")
    for backend in ("cpu", "reference"):
        e = S.Engine(tiny_q2["model"], backend=backend, gpu_graphs="on")
        try:
            assert (e.gpu_graphs, e.gpu_graphs_note) == ("off", f"off: the {backend} backend launches no kernels")
            e.set_gpu_graphs("off")
            with pytest.raises(S.BackendUnavailableError, match=f"gpu_graphs on: the {backend} backend launches no"):
                e.set_gpu_graphs("on")
            with pytest.raises(ValueError, match="gpu_graphs must be one of off, on, got 'auto'"):
                e.set_gpu_graphs("auto")
        finally:
            e.close()


def test_prefill_gemm_is_a_gpu_option_named_on_every_backend(tiny_q2):
    """Spec platform.md §7: the CPU backend keeps float32 products; auto says so, bf16/f16 are refused."""
    for backend in ("cpu", "reference"):
        with pytest.raises(S.BackendUnavailableError, match=f"prefill_gemm bf16 runs on the GPU backend only; the "
                                                            f"{backend} backend keeps float32 products"):
            S.Engine(tiny_q2["model"], backend=backend, prefill_gemm="bf16")
    e = S.Engine(tiny_q2["model"], backend="cpu")
    try:
        assert e.prefill_gemm == "off" and e.prefill_gemm_note == "off: the cpu backend keeps float32 products"
    finally:
        e.close()


def test_thread_count_is_bounded(tiny_q2):
    from ds4tui._native import lib

    assert lib.DS4_MAX_THREADS == S.MAX_THREADS
    with pytest.raises(ValueError, match=r"n_threads must be an integer 0\.\.256"):
        S.Engine(tiny_q2["model"], n_threads=100000)
    assert lib.ds4_memcpy_bandwidth(1 << 20, 1, 100000) == lib.DS4_E_INVALID
    assert lib.ds4_memcpy_bandwidth(1 << 20, 1, 2) > 0


def test_closing_the_engine_closes_its_sessions(tiny_q2, prompt):
    e = S.Engine(tiny_q2["model"])
    s = e.session(64)
    s.prefill(prompt[:5])
    s.step()
    e.close()
    for call in (s.step, lambda: s.prefill([1]), s.stats, s.memory, lambda: s.truncate(0), e.memory,
                 lambda: e.session(16)):
        with pytest.raises(S.EngineError, match="closed"):
            call()
    e.close()  # twice is fine


def test_two_threads_on_one_session_are_serialised(eng, prompt):
    s = eng.session(512)
    s.prefill(prompt[:20])
    errors = []

    def work():
        try:
            for _ in range(40):
                s.step()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    from ds4tui._native import lib

    assert s.n_tokens == 20 + 79 == lib.ds4_session_n_tokens(s.backend.handle)
    assert s.stats().n_decode_tokens == 80


def test_a_cancel_while_idle_stops_the_next_call_unless_cleared(eng, prompt):
    s = eng.session(128)
    s.prefill(prompt[:10])
    s.cancel()  # nothing is running: the next model call stops
    with pytest.raises(S.CancelledError):
        s.prefill(prompt[10:12])
    assert s.n_tokens == 10
    s.cancel()
    s.clear_cancel()
    tok = s.step()[0]
    s.truncate(s.n_tokens)
    assert s.pending == tok
    s.step()
    assert s.tokens == prompt[:10] + [tok]


def test_sampling_knobs_are_checked_in_the_engine_s_float32_range():
    for bad in (S.SamplingParams(temperature=1e-320), S.SamplingParams(temperature=1e39),
                S.SamplingParams(top_k=2**40), S.SamplingParams(temperature=float("nan"))):
        with pytest.raises(ValueError):
            bad.validate()
    assert S.SamplingParams(temperature=1e-30).validate().temperature == 1e-30
