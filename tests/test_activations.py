"""The ``q8`` activations option end to end (spec ds4.md §2.9.5): the engine with 8-bit activations
for Q8_0, Q2_K and IQ2_XXS matrices stays close to the float32 engine, decides the same greedy tokens where the
float32 logits are decided, is batch-invariant, and is named in the JSON of generate, in `chat` (the
flag, the engine it opens, the app's title) and in `doctor`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import subprocess
import sys

import numpy as np
import pytest
from fake_chat import FakeChatEngine
from pilot_helpers import loaded

from ds4tui import cli
from ds4tui.engine.errors import BackendUnavailableError
from ds4tui.engine.session import Engine

PROMPT = [(i * 7919 + 13) % 120000 + 100 for i in range(40)]


def test_q8_logits_close_to_f32_and_same_decided_tokens(tiny_q2):
    with Engine(tiny_q2["model"], activations="f32") as ef, Engine(tiny_q2["model"], activations="q8") as eq:
        assert eq.activations == "q8"
        lf = ef.session(256, n_batch=64).prefill(PROMPT, logits="all")
        lq = eq.session(256, n_batch=64).prefill(PROMPT, logits="all")
    diff = np.abs(lf - lq)
    assert diff.max() > 0, "q8 computes the same floats as f32: the option does nothing"
    # the tiny q2 model's logits span about +-10; 8-bit activations move them by a few hundredths
    assert float(np.median(diff)) < 0.05 and float(diff.max()) < 1.0, (float(np.median(diff)), float(diff.max()))
    top2 = np.sort(lf, axis=1)[:, -2:]
    decided = (top2[:, 1] - top2[:, 0]) > 2 * diff.max(axis=1)
    assert decided.sum() >= len(PROMPT) // 2
    assert (lf.argmax(1)[decided] == lq.argmax(1)[decided]).all()


def test_q8_is_batch_invariant(tiny_q2):
    with Engine(tiny_q2["model"], activations="q8") as e:
        s = e.session(256, n_batch=64)
        whole = s.prefill(PROMPT, logits="all")
        s.reset()
        parts = np.concatenate([s.prefill(PROMPT[i:i + 1], logits="all") for i in range(len(PROMPT))])
    assert np.array_equal(whole, parts)


def test_q8_runs_on_the_cpu_and_gpu_backends_only(tiny_q2):
    with pytest.raises(BackendUnavailableError, match=r"q8\) run on the cpu and hip backends; the reference backend"):
        Engine(tiny_q2["model"], backend="reference", activations="q8")
    with pytest.raises(ValueError, match="activations must be auto or one of f32, q8"):
        Engine(tiny_q2["model"], activations="int8")


def test_auto_is_q8_on_the_cpu_and_f32_elsewhere(tiny_q2):
    """activations="auto" (the command line's default) resolves by the backend and says so; the
    Python API's default stays f32 (the oracle tests' numerics)."""
    e = Engine(tiny_q2["model"], backend="cpu", activations="auto")
    assert e.activations == "q8" and e.activations_note.startswith("auto: q8 on the cpu backend")
    r = Engine(tiny_q2["model"], backend="reference", activations="auto")
    assert r.activations == "f32" and r.activations_note.startswith("auto: f32 on the reference backend")
    assert Engine(tiny_q2["model"], backend="cpu").activations == "f32"
    # the same logits as asking for q8 by name
    a = Engine(tiny_q2["model"], backend="cpu", activations="q8").session(64)
    b = e.session(64)
    ids = [5, 900, 77, 12345, 42]
    np.testing.assert_array_equal(a.prefill(ids, logits="all"), b.prefill(ids, logits="all"))


def test_generate_json_names_the_option(tiny_q2):
    out = subprocess.run([sys.executable, "-m", "ds4tui", "generate", str(tiny_q2["model"]), "-p", "hello", "-n", "4",
                          "--raw", "--activations", "q8", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["activations"] == "q8"
    dflt = subprocess.run([sys.executable, "-m", "ds4tui", "generate", str(tiny_q2["model"]), "-p", "hello", "-n", "4",
                           "--raw", "--json", "--backend", "cpu"], capture_output=True, text=True, timeout=300)
    assert dflt.returncode == 0, dflt.stderr
    res = json.loads(dflt.stdout)
    assert res["activations"] == "q8" and res["activations_note"].startswith("auto: q8 on the cpu backend")
    bad = subprocess.run([sys.executable, "-m", "ds4tui", "generate", str(tiny_q2["model"]), "-p", "x",
                          "--activations", "int4"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--activations" in bad.stderr


def test_chat_takes_the_option_and_the_title_shows_it(tiny_q2, tmp_path):
    from ds4tui.app import DS4App
    from ds4tui.commands.chat import options_from_args
    from ds4tui.engine import worker as W
    from ds4tui.engine.telemetry import FakeBackend, MemorySample

    args = cli.build_parser().parse_args(["chat", str(tiny_q2["model"]), "--activations", "q8"])
    opts = options_from_args(args)
    # auto stays auto: both backends run it
    assert opts.activations == "q8" and opts.backend == "auto"
    assert options_from_args(cli.build_parser().parse_args(["chat", str(tiny_q2["model"])])).activations == "auto"
    on_gpu = options_from_args(cli.build_parser().parse_args(["chat", str(tiny_q2["model"]), "--activations", "q8",
                                                              "--backend", "hip"]))
    assert (on_gpu.activations, on_gpu.backend) == ("q8", "hip")
    chat = W.ChatEngine(tiny_q2["model"], backend="cpu", n_ctx=64, activations="q8")
    try:
        assert chat.info.activations == "q8" and chat.engine.activations == "q8"
    finally:
        chat.close()
    chat = W.ChatEngine(tiny_q2["model"], backend="cpu", n_ctx=64)  # the app's default: auto
    try:  # the welcome line says which activations ran and why (app.py: info.activations_note)
        assert chat.info.activations == "q8" and chat.info.activations_note.startswith("auto: q8 on the cpu backend")
    finally:
        chat.close()

    async def title(activations: str) -> str:
        o = dataclasses.replace(opts, save_dir=tmp_path, activations=activations)
        app = DS4App(o, engine_factory=lambda o, progress: FakeChatEngine(o), telemetry=FakeBackend([MemorySample(t_mono_s=0.0, backend="rss", device="cpu")]),
                     flush_s=None, memory_s=None)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.app.workers.wait_for_complete()
            await pilot.app.flush()
            return app.sub_title

    assert asyncio.run(title("q8")).endswith(" · activations q8")
    assert "activations" not in asyncio.run(title("f32"))


def test_doctor_names_the_option(capsys):
    assert cli.main(["doctor", "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["activations"]
    assert a["default"] == "auto" and a["choices"] == ["auto", "f32", "q8"] and "Q8_0" in a["note"]
    assert "q8 on the cpu backend" in a["note"]
    assert a["here"] in ("q8", "f32")  # auto's choice on the backend --backend auto picks here
    assert cli.main(["doctor"]) == 0
    assert "activations" in capsys.readouterr().out


def test_q8_greedy_dspark_on_equals_off(tiny_q2, fitted_support):
    """Under q8 the verify rows are one-token decodes bit for bit (spec ds4.md §2.9.5), so greedy
    DSpark output equals target-only output token for token, with real drafting."""
    from ds4tui.engine import session as S

    rng = np.random.default_rng(7)
    prompts = [rng.integers(100, 128000, int(n)).tolist() for n in (25, 48)]
    n = 120

    def run(engine, prompt, **knobs):
        s = engine.session(len(prompt) + n + 8)
        if knobs:
            s.set_dspark(**knobs)
        s.prefill(prompt)
        out = []
        while len(out) < n:
            out += s.step(min(S.STEP_MAX, n - len(out)))
        st = s.dspark_stats() if knobs else None
        s.close()
        return out[:n], st

    with Engine(tiny_q2["model"], activations="q8") as plain, \
            Engine(tiny_q2["model"], activations="q8", support=fitted_support) as spec:
        assert spec.support_status == "attached", spec.support_message
        accepted = 0
        for p in prompts:
            want, _ = run(plain, p)
            got, st = run(spec, p, scheduler=False)
            assert got == want
            accepted += st.accepted_draft
    assert accepted > 0  # it did draft


async def test_chat_with_q8_says_why_auto_chose_the_cpu(tiny_q2, tmp_path):
    """``ds4tui chat --activations q8`` without a GPU: the welcome line gives the engine's reason for
    the cpu backend, the same sentence ``generate`` prints (q8 itself runs on either backend)."""
    from ds4tui.app import DS4App
    from ds4tui.commands.chat import options_from_args
    from ds4tui.engine.telemetry import FakeBackend, MemorySample

    opts = options_from_args(cli.build_parser().parse_args(["chat", str(tiny_q2["model"]), "--activations", "q8",
                                                            "--ctx", "64", "--save-dir", str(tmp_path)]))
    app = DS4App(opts, telemetry=FakeBackend([MemorySample(t_mono_s=0.0, backend="rss", device="cpu")]))
    async with app.run_test(size=(160, 40)) as pilot:
        await loaded(pilot, app)
        note = app.engine.engine.backend_note
        assert re.fullmatch(r"no usable GPU \(.+\): running on the CPU", note) and "q8" not in note
        welcome = str(app.query_one("#welcome").render())
        amx = app.engine.engine.amx_note  # auto's choice is said where it turned the AMX tiles on
        assert f"cpu backend; {note}{'; amx ' + amx if amx.startswith('auto: on') else ''}." in welcome
    app.close_engine()
