"""Interaction and layout tests of the chat app on a deterministic fake engine (tests/fake_chat.py);
every number-bearing test runs the real engine in tests/test_app.py."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading

import pytest
from fake_chat import ANSWER, REASONING, FakeChatEngine

from ds4tui import cli
from ds4tui.app import ACTIONS, ChatOptions, DS4App
from ds4tui.engine.telemetry import FakeBackend, MemorySample
from ds4tui.widgets.chat import DRAFT_STYLE, THINK_STYLE, AssistantMessage, UserMessage
from ds4tui.widgets.stream import StreamText

APU = MemorySample(t_mono_s=0.0, backend="sysfs", device="amdgpu card1 (0000:c3:00.0)", vram_total_b=512 << 20,
                   vram_used_b=310 << 20, gtt_total_b=133143986176, gtt_used_b=99 << 30, busy_pct=87)


def _app(tmp_path, gate=None, **kw) -> DS4App:
    opts = ChatOptions(model="demo.gguf", support="demo-support.gguf", save_dir=tmp_path, **kw)
    return DS4App(opts, engine_factory=lambda o, progress: FakeChatEngine(o, gate=gate),
                  telemetry=FakeBackend([APU]), flush_s=None, memory_s=None)


async def _ready(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.app.flush()


async def _turn(pilot, text="Write a linked list") -> None:
    app = pilot.app
    app.query_one("#prompt").value = text
    await pilot.press("enter")
    await app.workers.wait_for_complete()
    await app.flush()


@contextlib.asynccontextmanager
async def _after_a_turn(tmp_path, size):
    """The app at ``size`` with one answered turn: ``(app, pilot)``."""
    app = _app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await _ready(pilot)
        await _turn(pilot)
        await pilot.pause()
        yield app, pilot


async def test_palette_lists_every_action_and_runs_it(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=(150, 48)) as pilot:
        await _ready(pilot)
        commands = {c.title: c for c in app.get_system_commands(app.screen)}
        for _, key, _, _, title, _, _ in ACTIONS:
            assert f"{title} ({key})" in commands
        await pilot.press("ctrl+p")  # through the palette itself
        await pilot.press(*"Toggle DSpark")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert app.engine.calls[-1] == ("set_dspark", {"enabled": False})
        assert {b.id for b in app.BINDINGS} >= {a[0] for a in ACTIONS}  # every binding has an id (keymaps)
        # Textual's Quit with the app's key; its screenshot into --save-dir (it failed in a missing downloads folder)
        assert "Quit (ctrl+q)" in commands and "Quit" not in commands
        path = app.save_screen_picture()
        assert path is not None and path.parent == tmp_path and path.read_text().lstrip().startswith("<svg")
        await pilot.pause()
        assert app._notifications and list(app._notifications)[-1].message == f"screenshot saved: {path}"
        app.options.save_dir = str(tmp_path / "gone")
        assert app.save_screen_picture() is None
        assert app.errors[-1][0] == "cannot save the screenshot" and str(tmp_path / "gone") in app.errors[-1][1]


async def test_reasoning_trace_highlight_think_toggle_and_new_chat(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=(150, 48)) as pilot:
        await _ready(pilot)
        await _turn(pilot)
        msg = app.query_one(AssistantMessage)
        assert msg.reasoning == REASONING and msg.answer == ANSWER and msg.has_class("has-reasoning")
        await pilot.press("f4")  # token trace with accepted drafts highlighted
        assert msg.has_class("trace") and app.trace
        await pilot.pause()  # (built while hidden: drawn when shown)
        live = msg.query_one("#trace", StreamText)
        assert live.text == REASONING + ANSWER and live.size.height == live.row_count > 1
        trace = msg.trace
        assert trace.plain == REASONING + ANSWER  # the reasoning too, in THINK_STYLE
        drafted = [s for s in trace.spans if str(s.style).endswith(DRAFT_STYLE)]
        pieces = [REASONING[i:i + 4] for i in range(0, len(REASONING), 4)] + [
            ANSWER[i:i + 4] for i in range(0, len(ANSWER), 4)]
        assert [trace.plain[s.start:s.end] for s in drafted] == [p for k, p in enumerate(pieces) if k % 3 == 1]
        assert [trace.plain[s.start:s.end] for s in trace.spans if str(s.style).startswith(THINK_STYLE)] == [
            p for p in pieces[:len(range(0, len(REASONING), 4))]]
        await pilot.press("f5")  # nothink for the next turn
        assert app.think is False
        await _turn(pilot, "Again")
        second = app.query(AssistantMessage).last()
        assert second.reasoning == "" and not second.has_class("has-reasoning") and second.has_class("trace")
        assert [m["role"] for m in app.messages] == ["user", "assistant", "user", "assistant"]
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.messages == [] and not app.query(UserMessage) and not app.query(AssistantMessage)


async def test_escape_stops_a_held_turn_and_keeps_its_text(tmp_path):
    gate = threading.Event()
    app = _app(tmp_path, gate=gate)
    async with app.run_test(size=(150, 48)) as pilot:
        await _ready(pilot)
        app.query_one("#prompt").value = "Write a linked list"
        await pilot.press("enter")
        while app.engine._tokens < 5:  # the fake emits 5 tokens, then waits for the gate
            await pilot.pause(0.01)
        await pilot.press("escape")
        gate.set()
        await app.workers.wait_for_complete()
        await app.flush()
        r = app.turns[-1]
        msg = app.query_one(AssistantMessage)
        assert r.reason == "stopped" and len(r.ids) == 5
        assert msg.reasoning + msg.answer == r.reasoning + r.answer and msg.reasoning


async def test_memory_pane_shows_gtt_and_vram_separately(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=(150, 48)) as pilot:
        await _ready(pilot)
        text = app.query_one("#memory").text
        assert "GTT  99.00 GiB / 124.00 GiB 80%" in text
        assert "VRAM 310.0 MiB / 512.0 MiB 61%" in text and "(carve-out)" in text
        assert "GPU busy 87%" in text and "weights 196.0 MiB" in text and "optional caches: none" in text
        pane = app.query_one("#memory")
        spark = next(line for line in text.splitlines() if line.endswith(" 0–99.00 GiB"))  # the bars' scale, named
        assert set(spark.split()[0]) <= set("▁▂▃▄▅▆▇█") and len(spark) <= pane.content_size.width


def test_chat_without_a_terminal_is_refused_before_the_app_starts(tiny_q2, tmp_path):
    """``ds4tui chat </dev/null`` (or with output to a pipe): one line saying which stream is not a
    terminal and what to use instead, status 2, at once, not a screen drawn into a pipe waiting
    for keys that never come; the usage errors still come first."""
    import os
    import subprocess
    import sys

    base = [sys.executable, "-m", "ds4tui", "chat", str(tiny_q2["model"]), "--backend", "cpu", "--save-dir",
            str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run(base, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, env=env)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == ("ds4tui chat: error: the chat app needs a terminal: standard input is not one (it is "
                        "redirected from a file or a pipe); run it in a terminal, or use `ds4tui generate` for a run "
                        "without one\n")
    r = subprocess.run([*base, "--max-draft", "3"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 2 and "--max-draft needs a DSpark support model" in r.stderr



def test_chat_without_a_terminal_is_refused_before_the_demo_is_unpacked(tmp_path):
    """``ds4tui </dev/null`` on a machine that never unpacked the demo: the terminal line, status 2,
    with nothing unpacked first (it unpacked 99 MiB, with its progress on stderr, then refused)."""
    import os
    import subprocess
    import sys

    cache = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "DS4TUI_DEMO_DIR": str(cache)}
    r = subprocess.run([sys.executable, "-m", "ds4tui", "--backend", "cpu", "--save-dir", str(tmp_path)],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, env=env)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == ("ds4tui chat: error: the chat app needs a terminal: standard input is not one (it is "
                        "redirected from a file or a pipe); run it in a terminal, or use `ds4tui generate` for a run "
                        "without one\n")
    assert not cache.exists()


@pytest.mark.parametrize("ttys, problem", [
    ({0, 1, 2}, ""),
    ({0, 2}, ""),  # `ds4tui chat >log`: the app draws on standard error
    ({0, 1}, ""),  # `ds4tui chat 2>log`
    ({1, 2}, "standard input is not one (it is redirected from a file or a pipe)"),
    ({0}, "neither standard output nor standard error is one (both are redirected)"),
])
def test_terminal_problem_names_the_stream(ttys, problem, monkeypatch):
    from ds4tui.commands import chat

    monkeypatch.setattr(chat.os, "isatty", lambda fd: fd in ttys)
    monkeypatch.setattr(chat.os, "get_terminal_size", lambda fd: os.terminal_size((120, 40)))
    assert chat.terminal_problem() == problem


def test_a_terminal_of_no_size_is_refused(monkeypatch):
    """A pty whose window size was never set reads 0 x 0 (util-linux `script` with stdin redirected): the app
    drew frames at that size without end, a core busy and its signals unhandled."""
    from ds4tui.commands import chat

    monkeypatch.setattr(chat.os, "isatty", lambda fd: True)
    asked = []
    monkeypatch.setattr(chat.os, "get_terminal_size", lambda fd: asked.append(fd) or os.terminal_size((0, 0)))
    assert chat.terminal_problem() == ("it reports a size of 0 columns x 0 rows (no window size was set on it; give "
                                       "it one, e.g. `stty cols 120 rows 40`)") and asked == [1]

    def no_size(fd):
        raise OSError(25, "Inappropriate ioctl for device")

    monkeypatch.setattr(chat.os, "get_terminal_size", no_size)
    assert chat.terminal_problem() == ""  # nothing to ask: Textual's default size


def test_chat_command_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("ds4tui.demo.PACKAGE_DIR", tmp_path / "no-demo")
    assert cli.main(["chat"]) == 2
    assert "no bundled demo model" in capsys.readouterr().err
    assert cli.main([]) == 2  # plain `ds4tui` is `ds4tui chat`
    assert "make_test_model" in capsys.readouterr().err
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    assert cli.main(["chat", str(model), "--dspark"]) == 2
    assert "--dspark needs a support model" in capsys.readouterr().err
    assert cli.main(["chat", str(model), "--mtp", str(tmp_path / "s.gguf")]) == 1  # a file problem, as everywhere
    assert "s.gguf: no such file" in capsys.readouterr().err
    # a folder where a file should be is named as one, the model's and the support model's, status 1
    assert cli.main(["chat", str(tmp_path), "--mtp", str(model)]) == 1
    assert capsys.readouterr().err == (f"ds4tui chat: error: {tmp_path}: is a directory, expected a .gguf file "
                                       f"(argument MODEL: expected a DS4 model GGUF; check the path, or leave MODEL "
                                       f"out for the bundled demo model)\n")
    assert cli.main(["chat", str(model), "--mtp", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (f"ds4tui chat: error: {tmp_path}: is a directory, expected a .gguf file "
                                       f"(argument --mtp: expected a DSpark support GGUF; check the path)\n")
    with pytest.raises(SystemExit):
        cli.main(["chat", str(model), "--backend", "gpu"])
    capsys.readouterr()
    # --save-dir is checked at the start, not when Ctrl+S or F6 first writes there
    assert cli.main(["chat", str(model), "--save-dir", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err == (f"ds4tui chat: error: argument --save-dir: {tmp_path / 'nowhere'}: no such folder "
                                       f"(Ctrl+S and F6 write there: give a folder)\n")
    a_file = tmp_path / "somefile"
    a_file.write_text("x")
    assert cli.main([str(model), "--save-dir", str(a_file)]) == 2  # plain `ds4tui MODEL` is `ds4tui chat MODEL`
    assert capsys.readouterr().err == (f"ds4tui chat: error: argument --save-dir: {a_file}: is a file, not a folder "
                                       f"(Ctrl+S and F6 write there: give a folder)\n")


async def test_narrow_window_hides_the_panes_until_f12(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=(90, 30)) as pilot:
        await _ready(pilot)
        side, chat = app.query_one("#side"), app.query_one("#chat-column")
        assert not side.display or side.region.width == 0
        assert chat.region.width == 90
        await pilot.press("f12")
        await pilot.pause()
        assert side.region.width == 90 and chat.region.width == 0
        await pilot.press("f12")
        await pilot.pause()
        assert chat.region.width == 90
        # the prompt has the focus again: what is typed reaches it (it went nowhere before)
        assert app.focused is app.query_one("#prompt")
        await pilot.press("h", "i")
        assert app.query_one("#prompt").value == "hi"
        assert "under 110 columns: F12 shows them" in str(app.query_one("#welcome").render())
        # the panes shown, then the window widened: the chat is back beside them, and typing reaches it
        await pilot.press("f12")
        await pilot.pause()
        await pilot.resize_terminal(140, 30)
        await pilot.pause()
        await pilot.pause()
        assert chat.region.width > 0 and app.focused is app.query_one("#prompt")
        await pilot.press("!")
        assert app.query_one("#prompt").value == "hi!"  # the draft goes on (not replaced by the key)


async def test_no_draft_reasons_are_explained_and_toasts_are_words(tmp_path):
    from ds4tui.engine.stats import NO_DRAFT_HELP
    from ds4tui.widgets.dialogs import InfoDialog

    app = _app(tmp_path)
    async with app.run_test(size=(150, 48)) as pilot:
        await _ready(pilot)
        await _turn(pilot)
        st = app.last_snapshot.dspark
        assert st.dominant_no_draft_reason == "scheduler_skip"
        pane = app.query_one("#no-draft")
        assert "→ " + NO_DRAFT_HELP["scheduler_skip"][1] in pane.text  # what to do about the dominant one
        assert NO_DRAFT_HELP["scheduler_skip"][0] in str(pane.tooltip)
        await pilot.press("f1")
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, InfoDialog)
        n = st.no_draft_reasons["scheduler_skip"]
        assert dialog.text.startswith(f"scheduler_skip ({n} cycles)\n  why: {NO_DRAFT_HELP['scheduler_skip'][0]}")
        for why, todo in NO_DRAFT_HELP.values():  # every reason, explained
            assert why in dialog.text and todo in dialog.text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, InfoDialog)
        await pilot.press("f2")
        await pilot.pause()
        assert [m.message for m in app._notifications][-1] == "DSpark off — from the next cycle"
        await pilot.press("f9")
        await pilot.pause()
        assert [m.message for m in app._notifications][-1] == "at most 4 drafts per cycle — from the next cycle"


@pytest.mark.parametrize("size", [(150, 45), (160, 45), (200, 50)])
async def test_every_pane_is_in_view_without_scrolling(tmp_path, size):
    """Acceptance, both histograms, stage timings and memory (GTT) — the panes the product is
    about — and all the others fit the window: nothing below the fold of the side panel."""
    async with _after_a_turn(tmp_path, size) as (app, pilot):
        side = app.query_one("#side")
        assert side.max_scroll_y == 0
        for pid in ("knobs", "accept", "draft-hist", "accepted-hist", "no-draft", "throughput", "stages", "memory",
                    "support"):
            pane = app.query_one(f"#{pid}")
            assert side.region.contains_region(pane.region) and pane.region.height == pane.outer_size.height, pid
        assert "GTT" in app.query_one("#memory").text


@pytest.mark.parametrize("size", [(110, 40), (150, 45)])
async def test_the_accept_rate_names_its_denominator_in_one_row_of_the_narrowest_pane(tmp_path, size):
    """The acceptance pane's accept rate says it is a share of the proposed drafts (the answer's
    summary gives the drafted share of its output tokens: two different shares), and the line stays
    one row in the narrowest pane the layouts give (43 columns in two columns from 150), even at
    100.0% for both the session and the recent window."""
    async with _after_a_turn(tmp_path, size) as (app, pilot):
        pane = app.query_one("#accept")
        view = dataclasses.replace(app.timeline.view(), session_accept=100.0, recent_accept=100.0)
        pane.show(app.last_snapshot.dspark, view)
        await pilot.pause()
        first = pane.text.splitlines()[0]
        assert first == "accept 100.0% of proposed · 100.0% recent"
        assert len(first) <= pane.content_size.width


async def test_the_throughput_series_are_scaled_to_the_points_drawn(tmp_path):
    """A point older than the drawn ones (the kept history is 240 points, the line 36) no longer sets the
    scale: one spike scrolled out of view left both lines flat at ▁ for the rest of the session."""
    from ds4tui.widgets.speculation import SPARK_WIDTH

    async with _after_a_turn(tmp_path, (150, 45)) as (app, pilot):
        pane = app.query_one("#throughput")
        old = (21432.0,) + (300.0,) * 100  # the spike, then 100 points at 300..400 t/s
        drawn = tuple(300.0 + (i % 5) * 25 for i in range(SPARK_WIDTH))
        view = dataclasses.replace(app.timeline.view(), decode_series=old + drawn, effective_series=old + drawn,
                                   marks=frozenset())
        pane.show(view, app.last_snapshot.dspark, n_tokens=10, n_ctx=4096)
        await pilot.pause()
        dec = next(line for line in pane.text.splitlines() if line.startswith("dec "))[4:]
        assert len(dec) == SPARK_WIDTH and "█" in dec and set(dec) != {"▁"}


async def test_the_throughput_rates_fit_one_row_of_the_narrowest_pane_at_gpu_speeds(tmp_path):
    """The rates line of the throughput pane at an H200's demo speeds: whole tokens a second from 100
    t/s, so that the line stays one row of a 43-column pane (at one decimal, 1305.2 and 1692.4 t/s
    made it 44 characters, wrapped); below 100 t/s one decimal, as a Strix Halo's 16.9 t/s needs."""
    async with _after_a_turn(tmp_path, (150, 45)) as (app, pilot):
        pane = app.query_one("#throughput")
        for dec, eff, line in ((1305.2, 1692.4, "decode 1305 · effective 1692 t/s (1.30×)"),
                               (16.94, 20.51, "decode 16.9 · effective 20.5 t/s (1.21×)"),
                               (99.96, 99.94, "decode 100 · effective 99.9 t/s (1.00×)")):
            view = dataclasses.replace(app.timeline.view(), decode_tps=dec, effective_tps=eff)
            pane.show(view, app.last_snapshot.dspark, n_tokens=10, n_ctx=4096)
            await pilot.pause()
            first = pane.text.splitlines()[0]
            assert first == line and len(first) <= pane.content_size.width


@pytest.mark.parametrize("size, width", [((110, 40), 51), ((150, 45), 43)])
async def test_the_acceptance_counts_fit_the_narrowest_pane_when_they_are_large(tmp_path, size, width):
    """After a long session the counts have five digits: each of the pane's lines of counts still fits
    one row of the narrowest pane (43 columns from 150), so that no count is wrapped away from its name
    (``cycles ... · accepted_draft`` above a lone ``34567``); stop_cut, once a stop token cut a cycle,
    goes with accepted_draft, whose count it qualifies."""
    async with _after_a_turn(tmp_path, size) as (app, pilot):
        pane = app.query_one("#accept")
        st = dataclasses.replace(app.last_snapshot.dspark, cycles=12345, proposed=61725, accepted_draft=34567,
                                 full=4321, partial=5432, miss_first=2592, stop_cut=12)
        pane.show(st, app.timeline.view())
        await pilot.pause()
        lines = pane.text.splitlines()
        assert lines[2:5] == ["cycles 12345 · proposed 61725", "accepted_draft 34567 · stop_cut 12",
                              "full 4321 · partial 5432 · miss_first 2592"]
        assert max(len(line) for line in lines) <= pane.content_size.width == width
        assert pane.region.height - 2 == len(lines)  # one row a line: nothing wrapped

def test_a_failed_load_names_its_real_cause(tmp_path):
    """Only a bad file reads "cannot open the model"; a GPU, memory or settings problem says so."""
    from ds4tui.app import load_failure
    from ds4tui.engine import errors as E

    opts = ChatOptions(model="m.gguf", support="s.gguf", save_dir=tmp_path)
    cases = [
        (E.BackendUnavailableError("HIP backend: no GPU device found"), "the GPU backend cannot run here", "--backend cpu"),
        (E.DeviceMemoryError("needs 90 GiB, 64 GiB free", need=90, budget=64, source="sysfs",
                             advice="raise ttm.pages_limit to 31457280"),
         "the model does not fit the GPU memory", "ttm.pages_limit"),
        (E.TruncatedFileError("m.gguf", "truncated at byte 16"), "cannot open the model", "ds4tui inspect"),
        (E.MissingTensorError("s.gguf", "mtp.0.attn_q", "missing"), "cannot open the support model", "valid file"),
        (ValueError("max draft length 9 exceeds the support model's block size 5 (use 0 or 1..5)"),
         "the max draft length (DS4_DSPARK_MAX_DRAFT_TOKENS) does not fit this model", "range"),
        (ValueError("--ctx 99999: the context size must be 2..4096 (the model's context length)"),
         "--ctx does not fit this model", "range"),
        (PermissionError(13, "Permission denied", "m.gguf"), "cannot read m.gguf", "permissions"),
    ]
    for exc, title, todo in cases:
        got_title, got_todo = load_failure(exc, opts)
        assert got_title == title and todo in got_todo, (exc, got_title, got_todo)


async def test_no_gpu_is_not_blamed_on_the_model_file(tmp_path):
    from ds4tui.engine import errors as E
    from ds4tui.widgets.dialogs import ErrorDialog

    def no_gpu(options, progress):
        raise E.BackendUnavailableError("--backend hip: this build has no GPU library (no hipcc or nvcc was found)")

    app = DS4App(ChatOptions(model="demo.gguf", support=None, save_dir=tmp_path, backend="hip"),
                 engine_factory=no_gpu, telemetry=FakeBackend([APU]), flush_s=None, memory_s=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.workers.wait_for_complete()
        await app.flush()
        await pilot.pause()
        assert isinstance(app.screen, ErrorDialog)
        title, message = app.errors[0]
        assert title == "the GPU backend cannot run here" and "no GPU library" in message
        assert "What to do: start again with --backend cpu" in app.screen.message
        welcome = str(app.query_one("#welcome").render())
        assert "the GPU backend cannot run here" in welcome and "model" not in welcome.split("\n")[0].replace(
            "No model loaded", "")
        # no pane keeps waiting for an engine that will not come
        for pid in ("accept", "draft-hist", "accepted-hist", "no-draft", "throughput", "stages", "support", "memory"):
            assert app.query_one(f"#{pid}").text == "no model loaded (see the chat)", pid
        assert str(app.query_one("#knob-note").render()) == "no model loaded (see the chat)"
        status = lambda: str(app.query_one("#status").render())  # noqa: E731
        assert status().startswith("no model loaded · Ctrl+Q quits")
        await pilot.press("escape")  # the dialog closed, then a key that redraws the status line
        await pilot.press("f5")
        await pilot.pause()
        assert status().startswith("no model loaded · Ctrl+Q quits") and "loading" not in status()


async def test_chat_takes_the_sampling_options_of_generate(tmp_path):
    from ds4tui.commands.chat import options_from_args

    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    args = cli.build_parser().parse_args(["chat", str(model), "--temp", "0.7", "--top-k", "40", "--top-p", "0.9",
                                          "--min-p", "0.05", "--seed", "3", "--numerics", "transformers"])
    o = options_from_args(args)
    assert (o.temperature, o.top_k, o.top_p, o.min_p, o.seed, o.numerics) == (0.7, 40, 0.9, 0.05, 3, "transformers")
    app = _app(tmp_path, temperature=0.7, top_k=40, min_p=0.05, numerics="transformers")
    async with app.run_test(size=(150, 48)) as pilot:
        await _ready(pilot)
        await _turn(pilot)
        assert app.sub_title.endswith(" · numerics transformers")  # a numerics option is shown
        payload, _ = app._stats_payload()  # what F6 writes: the numerics and sampling are part of the run
        assert payload["numerics"] == "transformers"
        assert payload["sampling"] == {"temperature": 0.7, "top_k": 40, "top_p": 1.0, "min_p": 0.05, "seed": 0}


async def test_a_stopped_prefill_leaves_the_conversation_as_it_was(tmp_path):
    gate = threading.Event()
    app = DS4App(ChatOptions(model="demo.gguf", support="demo-support.gguf", save_dir=tmp_path),
                 engine_factory=lambda o, progress: FakeChatEngine(o, gate=gate, hold_after=0),
                 telemetry=FakeBackend([APU]), flush_s=None, memory_s=None)
    async with app.run_test(size=(150, 48)) as pilot:
        await _ready(pilot)
        app.query_one("#prompt").value = "a very long prompt"
        await pilot.press("enter")
        await pilot.pause(0.1)
        await app.flush()
        # the context counts the prompt while it is prefilled (the fake prefills 40 tokens)
        assert "context 40/4096 tokens" in app.query_one("#throughput").text
        await pilot.press("escape")  # stopped before the first token
        await app.workers.wait_for_complete()
        await app.flush()
        assert app.messages == [] and app.turns == []
        summary = app.query(AssistantMessage).last().query_one("#summary")
        assert "stopped before the answer began; this prompt is not part of the conversation" in str(summary.render())


async def test_a_stats_export_is_shown_again_read_only(tmp_path):
    import json as _json

    from ds4tui.engine.stats import DSparkStats
    from ds4tui.widgets.dialogs import AskPath
    from ds4tui.widgets.histogram import Histogram

    app = _app(tmp_path)
    async with app.run_test(size=(160, 45)) as pilot:  # a run whose stats are written with F6
        await _ready(pilot)
        await _turn(pilot)
        await pilot.press("f6")
        await pilot.pause()
    export = next(tmp_path.glob("ds4tui-stats-*.json"))
    st = DSparkStats.from_dict(_json.loads(export.read_text())["dspark_stats"])
    app = _app(tmp_path)  # a fresh session: its panes have nothing yet
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot)
        await pilot.press("ctrl+o")  # the palette's "Show a stats export"; the newest export is offered
        await pilot.pause()
        assert isinstance(app.screen, AskPath) and app.screen.query_one("#ask-path").value == str(export)
        await pilot.press("enter")
        await pilot.pause()
        assert app.viewing == str(export)
        assert app.query_one("#draft-hist", Histogram).counts == st.draft_len_hist
        assert app.query_one("#accepted-hist", Histogram).counts == st.accepted_len_hist
        t = st.stage_timing()
        assert f"{'verify':<16}{t['verify_ms_per_drafted_cycle']:8.3f}" in app.query_one("#stages").text
        assert f"cycles {st.cycles} · proposed {st.proposed}" in app.query_one("#accept").text
        status = app.query_one("#status")
        assert "export view (Esc)" in str(status.render())
        assert len(str(status.render())) <= status.content_size.width  # one row, nothing cut (the name is on the borders)
        assert "— recent" in app.query_one("#accept").text  # an export holds no recent window
        await pilot.press("escape")  # back to the live panes
        await pilot.pause()
        assert app.viewing is None and "read-only" not in str(app.query_one("#status").render())
        # an export whose knobs changed during its session says so beside them
        d = _json.loads(export.read_text())
        d["knob_events"] = [{"cycle": 3, **d["knobs"]}]  # the knobs at its end, from cycle 3
        changed = tmp_path / "changed.json"
        changed.write_text(_json.dumps(d))
        app.view_export(str(changed))
        await pilot.pause()
        assert ("the knobs of changed.json at its end, changed at cycle 3: its counters mix them with the earlier "
                "ones (read-only; Esc: live)") in str(app.query_one("#knob-note").render())
        await pilot.press("escape")
        await pilot.pause()
        # knobs set after the last change a cycle took up: no cycle ran with the knobs shown
        d["knob_events"] = [{"cycle": 3, **d["knobs"], "scheduler": not d["knobs"]["scheduler"]}]
        changed.write_text(_json.dumps(d))
        app.view_export(str(changed))
        await pilot.pause()
        ran = "DSpark on · sched off · conf 0.00 · max 5"
        assert ("the knobs of changed.json at its end, set after its last cycle: no cycle ran with them; its "
                f"counters are of {ran} (changed at cycle 3) (read-only; Esc: live)") in str(
            app.query_one("#knob-note").render())
        await pilot.press("escape")
        await pilot.pause()
        # no change logged, F2 after the last answer: the file's knobs_in_force says what the cycles ran with
        d["knob_events"], d["knobs_in_force"] = [], dict(d["knobs"])
        d["knobs"] = {**d["knobs"], "enabled": False}
        changed.write_text(_json.dumps(d))
        app.view_export(str(changed))
        await pilot.pause()
        assert ("the knobs of changed.json at its end, set after its last cycle: no cycle ran with them; its "
                "counters are of DSpark on · sched confidence · conf 0.00 · max 5 (read-only; Esc: live)") in str(
            app.query_one("#knob-note").render())
        await pilot.press("escape")
        await pilot.pause()
        # a file that is not an export: one dialog naming it
        bad = tmp_path / "bad.json"
        bad.write_text('{"x": 1}')
        app.view_export(str(bad))
        await pilot.pause()
        assert app.errors[-1][0] == "cannot show the export" and str(bad) in app.errors[-1][1]


@pytest.mark.parametrize("think", [True, False])
async def test_the_question_stays_in_view_while_the_answer_streams_and_after(tmp_path, think):
    """While an answer streams it takes the rows of the view below the question (no layout per
    write, and none when it outgrows them: it scrolls within them), the reasoning section's title
    included; once it ends those rows go: the question stays
    in view above the answer and no blank rows stay below it.  The second turn too."""
    gate = threading.Event()
    app = _app(tmp_path, gate=gate)
    async with app.run_test(size=(200, 50)) as pilot:
        await _ready(pilot)
        app.think = think
        view = app.query_one("#transcript")
        for k, question in enumerate(("Write a Python function add(a, b).", "And sub(a, b)?")):
            gate.clear()
            app.engine._tokens = 0
            app.query_one("#prompt").value = question
            await pilot.press("enter")
            while app.engine._tokens < 5:  # the fake emits 5 tokens (reasoning, if on), then waits for the gate
                await pilot.pause(0.01)
            await app.flush()
            q, msg = app.query(UserMessage).last(), app.current
            for _ in range(20):  # the prefill's bar went at the first write: the view grew, the reserve follows
                await pilot.pause()
                if q.region.y == view.region.y and msg.region.bottom == view.region.bottom:
                    break
            assert msg.has_class("has-reasoning") == think and msg.reasoning + msg.answer
            # the top of the view (its blank margin row above, scrolled past: something to scroll back by)
            assert view.region.contains_region(q.region) and q.region.y == view.region.y and view.max_scroll_y >= 1
            assert msg.region.bottom == view.region.bottom  # the reserve fills the view, not more
            gate.set()
            await app.workers.wait_for_complete()
            await app.flush()
            await pilot.pause()
            assert msg.finished and msg.answer == ANSWER
            assert view.region.contains_region(q.region)
            summary = msg.query_one("#summary")
            assert summary.region.bottom == view.region.bottom  # no blank rows below the answer
            assert msg.outer_size.height == sum(w.outer_size.height + w.styles.margin.top
                                                for w in msg.children if w.display) + msg.styles.gutter.height


@pytest.mark.parametrize("width, stacked", [(40, True), (60, False), (150, False)])
async def test_every_knob_is_inside_its_pane_at_any_width(tmp_path, width, stacked):
    """In a 40-column window (F12: the panes in the chat's place) the knobs stack a label and its control a
    row; the scheduler switch and the max-draft field were cut off at the pane's border."""
    from textual.widgets import Label

    async with _after_a_turn(tmp_path, (width, 40)) as (app, pilot):
        if width < 110:
            await pilot.press("f12")
            await pilot.pause()
        knobs = app.query_one("#knobs")
        assert knobs.has_class("-stacked") == stacked
        labels = {str(lbl.render()): lbl for lbl in knobs.query(Label)}
        rows = set()
        for name, cid in (("DSpark", "dspark"), ("scheduler", "scheduler"), ("confidence", "threshold"),
                          ("max draft", "max-draft")):
            control, label = app.query_one(f"#{cid}"), labels[name]
            assert knobs.content_region.contains_region(control.region), cid
            assert label.region.y == control.region.y and label.region.right <= control.region.x, cid
            rows.add(control.region.y)
        assert len(rows) == (4 if stacked else 2)


@pytest.mark.parametrize("size", [(200, 50), (160, 45), (150, 45)])
async def test_knob_fields_show_what_is_typed_and_give_the_prompt_back(tmp_path, size):
    """The confidence and max-draft fields are one row with the typed text in view; Enter applies
    and returns to the prompt, a bad value names what was found and keeps the field, Esc leaves it
    (showing the engine's value again)."""
    from textual.widgets import Input

    app = _app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await _ready(pilot)
        await pilot.pause()
        prompt, threshold, max_draft = (app.query_one(f"#{i}", Input) for i in ("prompt", "threshold", "max-draft"))
        assert app.focused is prompt

        def shown(field: Input) -> str:
            assert field.region.height == 1 and field.content_region.height == 1
            assert app.query_one("#knobs").region.contains_region(field.region)
            return field.render_line(0).text

        toasts = lambda: [m.message for m in app._notifications]  # noqa: E731
        while app.focused is not threshold:  # as a user gets there
            await pilot.press("tab")
        await pilot.press(*"0.3")
        await pilot.pause()
        assert threshold.value == "0.3" and "0.3" in shown(threshold)
        await pilot.press("enter")
        await pilot.pause()
        assert app.engine.calls[-1] == ("set_dspark", {"threshold": 0.3}) and app.focused is prompt
        assert threshold.value == "0.30" and toasts()[-1] == "confidence threshold 0.30 — from the next cycle"
        threshold.focus()
        await pilot.press(*"1.7", "enter")
        await pilot.pause()
        assert toasts()[-1] == "confidence threshold: a number in [0, 1], found 1.7; it stays 0.30 (Esc shows it again)"
        assert app.focused is threshold and "1.7" in shown(threshold)  # to be corrected
        await pilot.press("escape")  # leaves the field without applying it
        await pilot.pause()
        assert app.focused is prompt and threshold.value == "0.30" and app.engine.knobs.threshold == 0.3
        threshold.focus()  # a tiny threshold still gates: shown as it is, not as "0.00" (which reads as off)
        await pilot.press(*["backspace"] * 4, *"1e-9", "enter")
        await pilot.pause()
        assert app.engine.knobs.threshold == 1e-9 and toasts()[-1] == "confidence threshold 1e-09 — from the next cycle"
        assert threshold.value == "1e-09" and "conf 1e-09" in str(app.query_one("#knob-note").render())
        app.set_focus(prompt)
        await pilot.press("f7")  # down to 0 (it said "at its minimum, 0.00" and stayed at 1e-09)
        await pilot.pause()
        assert app.engine.knobs.threshold == 0.0 and toasts()[-1] == "confidence threshold 0.00 — from the next cycle"
        await pilot.press("f7")
        await pilot.pause()
        assert toasts()[-1] == "confidence threshold is at its minimum, 0.00"
        max_draft.focus()
        await pilot.press("9", "enter")
        await pilot.pause()
        assert toasts()[-1] == "max draft length: an integer 1..5, found 9; it stays 5 (Esc shows it again)"
        assert app.focused is max_draft and "9" in shown(max_draft) and app.engine.knobs.max_draft == 5
        await pilot.press("backspace", "3", "enter")
        await pilot.pause()
        assert app.engine.calls[-1] == ("set_dspark", {"max_draft": 3}) and app.focused is prompt
        assert max_draft.value == "3" and "3" in shown(max_draft)
        calls = len(app.engine.calls)
        max_draft.focus()  # the value in force again: said so, not "from the next cycle"
        await pilot.press("backspace", "3", "enter")
        await pilot.pause()
        assert toasts()[-1] == "at most 3 drafts per cycle — already so: nothing changed"
        assert len(app.engine.calls) == calls and app.focused is prompt


async def test_an_export_on_show_has_its_own_knobs_and_figures_and_a_bad_file_is_named(tmp_path):
    """Ctrl+O: the knobs pane shows the export's knobs (controls disabled), the throughput pane its
    decode rate and recorded interface cost, the panes that stay live say so; Esc: live again.  A
    file that is not JSON: one dialog naming it and what was expected."""
    import json as _json

    app = _app(tmp_path)
    async with app.run_test(size=(160, 45)) as pilot:  # an export made with the scheduler on
        await _ready(pilot)
        await _turn(pilot)
        await pilot.press("f6")
        await pilot.pause()
    export = next(tmp_path.glob("ds4tui-stats-*.json"))
    d = _json.loads(export.read_text())
    assert d["knobs"]["scheduler"] is True
    d["interface"]["cpu_share"] = 0.098  # as a long session records it
    export.write_text(_json.dumps(d))
    tokens, decode_ms = d["stats"]["n_decode_tokens"], d["stats"]["decode_ms"]
    app = _app(tmp_path)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot)
        await pilot.press("f3")  # the live scheduler goes off
        await pilot.pause()
        knobs = app.query_one("#knobs")
        assert "sched off" in str(knobs.query_one("#knob-note").render())
        app.query_one("#dspark").focus()  # a knob has the focus: the export disables it (the focus moves off)
        await pilot.pause()
        app.view_export(str(export))
        await pilot.pause()
        note = str(knobs.query_one("#knob-note").render())
        assert "DSpark on · sched on · conf 0.00 · max 5" in note and f"the knobs of {export.name} (read-only" in note
        assert all(app.query_one(f"#{i}").disabled for i in ("dspark", "scheduler", "threshold", "max-draft", "policy"))
        assert app.query_one("#scheduler").value is True
        text = app.query_one("#throughput").text
        assert f"decode {1000 * tokens / decode_ms:.1f} t/s: the session's average" in text
        assert "interface 9.8% of a core while streaming" in text and "measured while streaming" not in text
        assert app.query_one("#throughput").border_subtitle == export.name
        assert app.query_one("#throughput").border_title == "throughput"  # the session's average: no window
        assert app.query_one("#memory").border_subtitle == app.query_one("#support").border_subtitle == "live"
        await pilot.press("f2")  # a live knob changes while the export is on show: the pane keeps the export's
        await pilot.pause()
        assert app.engine.knobs.enabled is False and "DSpark on · sched on" in str(knobs.query_one("#knob-note").render())
        await pilot.press("escape")
        await pilot.pause()
        assert app.viewing is None and app.query_one("#throughput").border_subtitle is None
        assert app.query_one("#throughput").border_title == "throughput · last 2 s"  # live: the rates' window
        assert "DSpark off · sched off" in str(knobs.query_one("#knob-note").render())
        assert not app.query_one("#scheduler").disabled and app.query_one("#scheduler").value is False
        assert app.focused is app.query_one("#prompt")  # typing goes to the prompt again, not to the transcript
        garbage = tmp_path / "g.txt"
        garbage.write_text("hello\n")
        app.view_export(str(garbage))
        await pilot.pause()
        title, message = app.errors[-1]
        assert title == "cannot show the export" and app.viewing is None
        assert message == (f"{garbage}: not JSON (Expecting value at line 1 column 1); expected a stats export "
                           "that F6 wrote (ds4tui-stats-*.json) or a Ctrl+S transcript (ds4tui-chat-*.json)")


async def test_a_new_session_drops_the_old_figures_and_knob_limits_are_said(tmp_path):
    """Ctrl+G (a new session): the interface cost, rates and memory of the old session do not
    stay on screen (nor in the next export).  F10 at the maximum draft length and F9 at 1 say so."""
    import dataclasses
    import json as _json

    from ds4tui.app import InterfaceCost

    app = _app(tmp_path)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot)
        await _turn(pilot)
        app.ui_cost = InterfaceCost(cpu_s=0.25, wall_s=2.0, text_writes=10, max_text_gap_s=0.2)  # a long session's
        app._apply_snapshot(app.engine.snapshot(generating=False))
        assert "interface 12.5% of a core while streaming" in app.query_one("#throughput").text
        # the dialog's plan: on the CPU no GPU check is offered; on the GPU inspect with the real model path
        about = app.describe_context("8192")
        # its scratch is what the memory pane shows after the change (the fake's memory(): 24 MiB)
        assert about == ("a session of 8192 tokens holds 28.6 MiB beside the weights: KV window ring 1.6 MiB, "
                         "compressed KV 3.0 MiB, scratch 24.0 MiB")
        app.engine.info = dataclasses.replace(app.engine.info, backend="hip")
        assert app.describe_context("8192") == (
            "a session of 8192 tokens holds 28.6 MiB beside the weights: KV window ring 1.6 MiB, compressed KV 3.0 MiB, "
            "scratch 24.0 MiB (9.0 MiB of it in host memory); `ds4tui inspect demo.gguf --ctx 8192` checks it "
            "against the GPU's memory")
        app.engine.info = dataclasses.replace(app.engine.info, backend="cpu")
        plan = app.engine.session_plan
        app.engine.session_plan = lambda n: {**plan(n), "amx_copies": 42 << 20}  # the amx option's copies, named
        assert app.describe_context("8192") == (
            "a session of 8192 tokens holds 28.6 MiB beside the weights and their amx copies (42.0 MiB, the same at "
            "any size): KV window ring 1.6 MiB, compressed KV 3.0 MiB, scratch 24.0 MiB")
        app.engine.session_plan = plan
        await app.set_context("8192")
        await pilot.pause()
        text = app.query_one("#throughput").text
        assert "12.5%" not in text and "interface cost: measured while streaming" in text
        assert "decode — · effective — t/s" in text and "context 40/8192 tokens" in text
        assert "KV ring 1.6 MiB" in app.query_one("#memory").text  # the new session's KV, not the old one's
        assert app.ui_cost.wall_s == 0 and app.turn_costs == []
        await pilot.press("f6")
        await pilot.pause()
        stats = _json.loads(next(tmp_path.glob("ds4tui-stats-*.json")).read_text())
        assert stats["interface"]["text_writes"] == 0 and stats["n_ctx"] == 8192
        toasts = lambda: [m.message for m in app._notifications]  # noqa: E731
        assert app.engine.knobs.max_draft == 5  # the block size
        n = len(app.engine.calls)
        await pilot.press("f10")
        await pilot.pause()
        assert toasts()[-1] == "max draft length is at its maximum, 5 (the support model's block size)"
        assert len(app.engine.calls) == n  # nothing to set
        for _ in range(4):
            await pilot.press("f9")
        await pilot.pause()
        assert app.engine.knobs.max_draft == 1
        await pilot.press("f9")
        await pilot.pause()
        assert toasts()[-1] == "max draft length is at its minimum, 1"
        await pilot.press("f7")  # the threshold is 0
        await pilot.pause()
        assert toasts()[-1] == "confidence threshold is at its minimum, 0.00"


@pytest.mark.parametrize("width, stacked", [(40, True), (150, False)])
async def test_the_histograms_stack_where_two_side_by_side_would_wrap_their_lines(tmp_path, width, stacked):
    """In a 40-column window (F12) each histogram line wrapped its percentage onto a row of its own."""
    async with _after_a_turn(tmp_path, (width, 45)) as (app, pilot):
        if width < 110:
            await pilot.press("f12")
            await pilot.pause()
        assert app.query_one("#histograms").has_class("-stacked") == stacked
        for hid in ("draft-hist", "accepted-hist"):
            h = app.query_one(f"#{hid}")
            lines = h.text.splitlines()
            assert max(len(line) for line in lines) <= h.content_size.width and h.region.height == len(lines) + 2


@pytest.mark.parametrize("width", [110, 150])
async def test_the_status_line_fits_one_row_of_the_chat_column_with_every_part(tmp_path, width):
    """ready, thinking off, F4's highlight and an export on show: one row of the narrowest chat column (50
    columns in a 110-column window); it was cut mid-word without a mark."""
    async with _after_a_turn(tmp_path, (width, 40)) as (app, pilot):
        await pilot.press("f5", "f4")
        app.viewing = "x.json"  # (the status line's part for an export on show)
        app._set_status()
        await pilot.pause()
        status = app.query_one("#status")
        text = str(status.render())
        assert text == "ready · nothink · highlight · export view (Esc)" and len(text) <= status.content_size.width
        app.viewing = None


async def test_a_pasted_text_of_several_lines_is_sent_whole(tmp_path):
    """Textual's one-line input kept a paste's first line only, without a word: the prompt keeps every line
    (each break shown as ↵, said in a toast), sends them as line breaks, and ↑ brings the paste back whole."""
    from textual import events

    from ds4tui.widgets.chat import LINE_BREAK

    app = _app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await _ready(pilot)
        prompt = app.query_one("#prompt")
        pasted = "Fix this code:\r\ndef f(x):\n    return x+1\n\nThanks 🙂 — ünïcødé 中文\n"
        prompt.post_message(events.Paste(pasted))
        await pilot.pause()
        assert prompt.value == LINE_BREAK.join(["Fix this code:", "def f(x):", "    return x+1", "",
                                                "Thanks 🙂 — ünïcødé 中文"])
        assert "\n" not in prompt.render_line(0).text  # one row on the screen
        assert list(app._notifications)[-1].message == "pasted 5 lines: ↵ marks each line break, sent as one"
        shown = prompt.value
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await app.flush()
        sent = "Fix this code:\ndef f(x):\n    return x+1\n\nThanks 🙂 — ünïcødé 中文"
        assert app.messages[0] == {"role": "user", "content": sent}
        await pilot.press("up")  # the history holds it as the line showed it
        assert prompt.value == shown
        prompt.value = ""
        prompt.post_message(events.Paste("one line\n"))  # a single line (its newline dropped): as typed
        await pilot.pause()
        assert prompt.value == "one line"
        await app.workers.wait_for_complete()
        prompt.value = "What does the ↵ symbol mean?"  # typed, in a line no paste broke: sent as it is
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await app.flush()
        assert app.messages[-2] == {"role": "user", "content": "What does the ↵ symbol mean?"}


async def test_page_keys_scroll_the_transcript_from_the_prompt(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=(150, 30)) as pilot:
        await _ready(pilot)
        for k in range(3):
            await _turn(pilot, f"question {k}")
        await pilot.pause()
        view, prompt = app.query_one("#transcript"), app.query_one("#prompt")
        assert app.focused is prompt and view.max_scroll_y > 0 and view.is_vertical_scroll_end
        await pilot.press("pageup")
        await pilot.pause()
        assert view.scroll_y == view.max_scroll_y - view.scrollable_content_region.height and app.focused is prompt
        first = app.query(UserMessage).first()
        for _ in range(50):
            if view.scroll_y == 0:
                break
            await pilot.press("pageup")
            await pilot.pause()
        assert view.region.contains_region(first.region)  # the first question is back in view
        for _ in range(50):
            if view.is_vertical_scroll_end:
                break
            await pilot.press("pagedown")
            await pilot.pause()
        assert view.scroll_y == view.max_scroll_y


async def test_gpu_options_the_cpu_does_not_apply_are_named_in_the_welcome_line(tmp_path):
    # --backend auto fell back to the cpu (the fake engine's backend): the GPU options asked for are named
    app = _app(tmp_path, backend="auto", prefill_gemm="bf16", gpu_graphs="on")
    async with app.run_test(size=(160, 40)) as pilot:
        await _ready(pilot)
        welcome = str(app.query_one("#welcome").render())
        assert "--prefill-gemm bf16 and --gpu-graphs on do not apply on the cpu backend." in welcome.replace("\n", " ")
    app = _app(tmp_path, backend="auto", gpu_graphs="on")
    async with app.run_test(size=(160, 40)) as pilot:
        await _ready(pilot)
        welcome = str(app.query_one("#welcome").render()).replace("\n", " ")
        assert "; --gpu-graphs on does not apply on the cpu backend." in welcome and "prefill-gemm" not in welcome
    app = _app(tmp_path, backend="auto")
    async with app.run_test(size=(160, 40)) as pilot:
        await _ready(pilot)
        assert "does not apply" not in str(app.query_one("#welcome").render()).replace("\n", " ")


async def test_more_threads_than_usable_cores_are_named_in_the_welcome_line(tmp_path):
    import dataclasses

    note = ("8 threads asked on 2 usable cores: the workers share cores, which is usually slower; --threads 2 uses "
            "each core once")

    def factory(options, progress):
        engine = FakeChatEngine(options)
        engine.info = dataclasses.replace(engine.info, n_threads=8, threads_note=note)
        return engine

    app = DS4App(ChatOptions(model="demo.gguf", save_dir=tmp_path, threads=8), engine_factory=factory,
                 telemetry=FakeBackend([APU]), flush_s=None, memory_s=None)
    async with app.run_test(size=(160, 40)) as pilot:
        await _ready(pilot)
        welcome = str(app.query_one("#welcome").render()).replace("\n", " ")
        assert f"cpu backend; {note}" in welcome
    app = _app(tmp_path)  # the threads fit (the fake engine's note is "")
    async with app.run_test(size=(160, 40)) as pilot:
        await _ready(pilot)
        assert "usable cores" not in str(app.query_one("#welcome").render())


async def test_running_on_the_cpu_is_said_once_in_the_welcome_line(tmp_path):
    import dataclasses

    note = "no usable GPU (no CUDA driver is loaded): running on the CPU"

    def factory(options, progress):
        engine = FakeChatEngine(options)
        engine.info = dataclasses.replace(engine.info, backend_note=note)
        return engine

    app = DS4App(ChatOptions(model="demo.gguf", save_dir=tmp_path), engine_factory=factory,
                 telemetry=FakeBackend([APU]), flush_s=None, memory_s=None)
    async with app.run_test(size=(160, 40)) as pilot:
        await _ready(pilot)
        welcome = str(app.query_one("#welcome").render()).replace("\n", " ")
        assert f"cpu backend; {note}" in welcome and "backend (" not in welcome


async def test_a_demo_file_unpacked_again_is_named_in_the_welcome_line(tmp_path):
    # ds4tui chat without MODEL found a demo file damaged and unpacked it again (ChatOptions.notes)
    line = ("the demo's /cache/demo/0123/support.gguf had 6 bytes where demo.json expects 9: unpacked it again from "
            "the bundled support.gguf.xz")
    app = _app(tmp_path, notes=(line,))
    async with app.run_test(size=(160, 40)) as pilot:
        await _ready(pilot)
        welcome = str(app.query_one("#welcome").render())
        assert welcome.endswith(f"Type a prompt and press Enter.\nNote: {line}.")
    app = _app(tmp_path)
    async with app.run_test(size=(160, 40)) as pilot:
        await _ready(pilot)
        assert str(app.query_one("#welcome").render()).endswith("Type a prompt and press Enter.")


async def test_the_welcome_line_says_how_to_turn_thinking_off(tmp_path):
    # the chat starts in thinking mode, where the small demo model can reason until its context is
    # full: the welcome line names the key and the flag that turn it off (with --nothink: nothing said)
    app = _app(tmp_path)
    async with app.run_test(size=(160, 40)) as pilot:
        await _ready(pilot)
        welcome = str(app.query_one("#welcome").render()).replace("\n", " ")
        assert app.think is True
        assert welcome.endswith("cpu backend. Thinking mode is on: the model may reason until the context is full (F5 "
                                "turns it off, --nothink starts without it). Type a prompt and press Enter.")
        await pilot.press("f5")  # the key it names turns thinking off
        assert app.think is False
    app = _app(tmp_path, think=False)
    async with app.run_test(size=(160, 40)) as pilot:
        await _ready(pilot)
        welcome = str(app.query_one("#welcome").render()).replace("\n", " ")
        assert welcome.endswith("cpu backend. Type a prompt and press Enter.") and "thinking" not in welcome


async def test_the_scheduler_prices_option_is_in_the_welcome_line(tmp_path):
    # spec dspark.md §7.4: where the scheduler's prices start changes what is measured: shown
    app = _app(tmp_path, scheduler_prices="saved")
    async with app.run_test(size=(160, 40)) as pilot:
        await _ready(pilot)
        welcome = str(app.query_one("#welcome").render()).replace("\n", " ")
        assert "; scheduler prices saved: from /cache/scheduler-prices/0123.json (decode 2.20 ms)." in welcome
    app = _app(tmp_path, scheduler_prices="fresh")  # the engine's note is empty: nothing said
    async with app.run_test(size=(160, 40)) as pilot:
        await _ready(pilot)
        assert "scheduler prices" not in str(app.query_one("#welcome").render()).replace("\n", " ")


def _failing_writes(monkeypatch, code: int) -> None:
    """Every Path.write_text raises OSError(code) as the OS does (its strerror and the file)."""
    import os
    from pathlib import Path

    def refuse(self, *a, **kw):
        raise OSError(code, os.strerror(code), str(self))

    monkeypatch.setattr(Path, "write_text", refuse)


async def test_a_failed_save_says_why_and_what_to_do_and_quitting_asks_first(tmp_path, monkeypatch):
    """Ctrl+S / F6 into a read-only or full file system: the dialog names the file, the reason in
    words and the key that saves again; Ctrl+Q then asks before losing the conversation (Esc
    stays, Ctrl+Q again quits); once a save succeeds, Ctrl+Q quits at once."""
    import errno
    import os

    from ds4tui.widgets.dialogs import ConfirmQuit, ErrorDialog

    app = _app(tmp_path)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot)
        await _turn(pilot)
        with monkeypatch.context() as m:
            _failing_writes(m, errno.EROFS)
            await pilot.press("ctrl+s")
            await pilot.pause()
            title, message = app.errors[-1]
            md = next(iter(app.save_failed.values()))
            assert title == "cannot save the transcript" and isinstance(app.screen, ErrorDialog)
            assert md.parent == tmp_path and md.name.startswith("ds4tui-chat-") and md.suffix == ".md"
            assert message.startswith(f"{md}: {tmp_path} on a read-only file system "
                                      f"({os.strerror(errno.EROFS)}, errno EROFS).")
            assert f"remount the file system of {tmp_path} read-write and press Ctrl+S again" in message
            assert "press Ctrl+S again" in message and "--save-dir DIR" in message
            await pilot.press("escape")
            _failing_writes(m, errno.ENOSPC)
            await pilot.press("f6")
            await pilot.pause()
            title, message = app.errors[-1]
            assert title == "cannot write the stats" and f"no space left on the disk of {tmp_path}" in message
            assert f"free some space on the disk of {tmp_path} and press F6 again" in message
            await pilot.press("escape")
            await pilot.pause()
            assert not list(tmp_path.iterdir())  # nothing was written
            assert [line.split(":")[0] for line in app.unsaved_work()] == ["the transcript (1 question)", "the stats"]

            await pilot.press("ctrl+q")  # asks first
            await pilot.pause()
            assert isinstance(app.screen, ConfirmQuit) and app.is_running
            text = str(app.screen.query_one("#confirm-message").render())
            assert f"Ctrl+S could not write {md}" in text and "F6 could not write" in text
            assert text.endswith("press Ctrl+S / F6 again.")
            await pilot.press("escape")  # stays
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmQuit) and app.is_running
            await pilot.press("ctrl+q")
            await pilot.pause()
            await pilot.press("enter")  # Enter on the focused "Stay" button stays too
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmQuit) and app.is_running
        # the file system is writable again: both saves succeed and nothing is left unsaved
        await pilot.press("ctrl+s", "f6")
        await pilot.pause()
        assert app.save_failed == {} and app.unsaved_work() == []
        assert len(list(tmp_path.glob("ds4tui-chat-*.md"))) == 1 and len(list(tmp_path.glob("ds4tui-stats-*.json"))) == 1
        await pilot.press("ctrl+q")  # nothing unsaved: quits at once
        await pilot.pause()
        assert not app.is_running and app.return_code == 0


async def test_quit_anyway_after_a_failed_save(tmp_path, monkeypatch):
    """Ctrl+Q twice leaves with the unsaved transcript (status 0: the user chose to); a failed
    save of an empty conversation (nothing to save) asks nothing."""
    import errno

    from ds4tui.widgets.dialogs import ConfirmQuit

    app = _app(tmp_path)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot)
        await _turn(pilot)
        _failing_writes(monkeypatch, errno.EACCES)
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert f"no permission to write in {tmp_path}" in app.errors[-1][1]
        assert f"make {tmp_path} writable for this user and press Ctrl+S again" in app.errors[-1][1]
        await pilot.press("escape", "ctrl+q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmQuit)
        assert str(app.screen.query_one("#confirm-message").render()).endswith(
            "make the folder writable (or free space) and press Ctrl+S again.")
        await pilot.press("ctrl+q")  # again: quit anyway
        await pilot.pause()
        assert not app.is_running and app.return_code == 0

    app = _app(tmp_path)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot)
        await _turn(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press("escape", "ctrl+n", "ctrl+n")  # a new chat anyway: nothing left to lose
        await pilot.pause()
        assert app.save_failed and app.unsaved_work() == []
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert not app.is_running


async def test_a_new_chat_asks_first_when_the_transcript_could_not_be_saved(tmp_path, monkeypatch):
    """Ctrl+N after a failed Ctrl+S asks as quitting does, naming the file and what to do: Esc (or
    Enter on "Stay") keeps the conversation, Ctrl+N again clears it; a failed F6 alone asks
    nothing (a new chat keeps the counters), and neither does Ctrl+N once the transcript saved."""
    import errno

    from ds4tui.widgets.dialogs import ConfirmNewChat, ConfirmQuit

    app = _app(tmp_path)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot)
        await _turn(pilot)
        with monkeypatch.context() as m:
            _failing_writes(m, errno.ENOSPC)
            await pilot.press("ctrl+s")
            await pilot.pause()
            md = app.save_failed["transcript"]
            await pilot.press("escape", "ctrl+n")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmNewChat)
            assert str(app.screen.query_one("#confirm-title").render()) == "New chat without saving?"
            text = str(app.screen.query_one("#confirm-message").render())
            assert text == (f"Not saved, lost if you start a new chat now:\n- the transcript (1 question): Ctrl+S "
                            f"could not write {md}\n\nStay, make the folder writable (or free space) and press "
                            f"Ctrl+S again.")
            await pilot.press("escape")  # stays: the conversation is kept
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmNewChat) and len(app.messages) == 2
            assert len(app.query("UserMessage")) == 1
            await pilot.press("ctrl+n")
            await pilot.pause()
            await pilot.press("enter")  # Enter on the focused "Stay" button stays too
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmNewChat) and len(app.messages) == 2
            await pilot.press("ctrl+n")
            await pilot.pause()
            await pilot.press("ctrl+q")  # Ctrl+Q meanwhile asks about quitting, not about the new chat
            await pilot.pause()
            assert isinstance(app.screen, ConfirmQuit) and app.is_running and len(app.messages) == 2
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, (ConfirmQuit, ConfirmNewChat)) and len(app.messages) == 2
            await pilot.press("ctrl+n")
            await pilot.pause()
            await pilot.click("#go")  # the "New chat anyway" button
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmNewChat) and app.messages == [] and app.is_running
            assert len(app.query("UserMessage")) == 0
        await _turn(pilot)
        await pilot.press("ctrl+s")  # saved: nothing of the transcript is left unsaved
        await pilot.pause()
        assert "transcript" not in app.save_failed and len(list(tmp_path.glob("ds4tui-chat-*.md"))) == 1
        with monkeypatch.context() as m:
            _failing_writes(m, errno.EROFS)
            await pilot.press("f6")  # the stats: a new chat keeps the counters, so it does not ask
            await pilot.pause()
            assert "stats" in app.save_failed
            await pilot.press("escape", "ctrl+n")
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmNewChat) and app.messages == []


async def _context_size(pilot, text: str) -> None:
    """Ctrl+G, type ``text`` into the size dialog, Enter."""
    from ds4tui.widgets.dialogs import AskPath

    await pilot.press("ctrl+g")
    await pilot.pause()
    assert isinstance(pilot.app.screen, AskPath)
    pilot.app.screen.query_one("#ask-path").value = text
    await pilot.press("enter")
    await pilot.pause()


async def test_a_new_context_size_asks_first_when_the_transcript_could_not_be_saved(tmp_path, monkeypatch):
    """Ctrl+G after a failed Ctrl+S asks, once the size is typed, as Ctrl+N and Ctrl+Q do (the size,
    the file that could not be written, what to do): Esc (or Enter on "Stay") keeps the conversation
    and the session, Ctrl+Q meanwhile asks about quitting instead, a size the model does not take is
    refused without asking, and Ctrl+G again starts the new session with the chat cleared."""
    import errno

    from ds4tui.widgets.dialogs import Confirm, ConfirmContext, ConfirmQuit, ErrorDialog

    app = _app(tmp_path)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot)
        await _turn(pilot)
        with monkeypatch.context() as m:
            _failing_writes(m, errno.ENOSPC)
            await pilot.press("ctrl+s")
            await pilot.pause()
            md = app.save_failed["transcript"]
            assert ("Until then nothing is lost: the conversation stays while the app runs, and every key that "
                    "would discard it asks first (Ctrl+Q, Ctrl+N, Ctrl+G).") in app.errors[-1][1]
            await pilot.press("escape")
            await _context_size(pilot, "8192")
            assert isinstance(app.screen, ConfirmContext)
            title = str(app.screen.query_one("#confirm-title").render())
            assert title == "Change the context size to 8192 tokens without saving?"
            text = str(app.screen.query_one("#confirm-message").render())
            assert text == (f"Not saved, lost if you change the context size now:\n- the transcript (1 question): "
                            f"Ctrl+S could not write {md}\n\nStay, make the folder writable (or free space) and "
                            f"press Ctrl+S again.")
            assert str(app.screen.query_one("#go").label) == "New size anyway (Ctrl+G)"
            await pilot.press("escape")  # stays: the conversation and the session as they were
            await pilot.pause()
            assert not isinstance(app.screen, Confirm) and len(app.messages) == 2
            assert app.engine.info.n_ctx == 4096 and len(app.query("UserMessage")) == 1
            await _context_size(pilot, "8192")
            await pilot.press("enter")  # Enter on the focused "Stay" button stays too
            await pilot.pause()
            assert not isinstance(app.screen, Confirm) and len(app.messages) == 2 and app.engine.info.n_ctx == 4096
            await _context_size(pilot, "8192")
            await pilot.press("ctrl+q")  # asks about quitting; the new size is not asked about any more
            await pilot.pause()
            assert isinstance(app.screen, ConfirmQuit) and app.is_running
            assert not any(isinstance(s, ConfirmContext) for s in app.screen_stack)
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, Confirm) and len(app.messages) == 2 and app.engine.info.n_ctx == 4096
            await _context_size(pilot, "many")  # not a size: refused as before, nothing asked, nothing lost
            assert isinstance(app.screen, ErrorDialog) and app.errors[-1][0] == "cannot change the context size"
            await pilot.press("escape")
            await pilot.pause()
            assert len(app.messages) == 2 and app.engine.info.n_ctx == 4096
            await _context_size(pilot, "8192")
            await pilot.press("ctrl+g")  # Ctrl+G again: the new session, the chat cleared
            await pilot.pause()
            await pilot.pause()
            assert not isinstance(app.screen, Confirm) and app.engine.info.n_ctx == 8192
            assert app.messages == [] and len(app.query("UserMessage")) == 0 and app.is_running
            assert any(n.message.startswith("context 8192 tokens — a new session") for n in app._notifications)


async def test_a_new_context_size_asks_only_about_what_it_discards(tmp_path, monkeypatch):
    """With nothing unsaved Ctrl+G starts the new session at once; a failed F6 alone makes Ctrl+G ask
    (the new session's counters start from zero) but not Ctrl+N (a new chat keeps them); the
    button starts the new session; once F6 saves, Ctrl+G asks nothing again.  The failed save's
    dialog names the keys that ask."""
    import errno

    from ds4tui.widgets.dialogs import Confirm, ConfirmContext, ConfirmNewChat

    app = _app(tmp_path)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot)
        await _turn(pilot)
        await _context_size(pilot, "2048")  # nothing failed: no question
        await pilot.pause()
        assert not isinstance(app.screen, Confirm) and app.engine.info.n_ctx == 2048 and app.messages == []
        await _turn(pilot)
        with monkeypatch.context() as m:
            _failing_writes(m, errno.EROFS)
            await pilot.press("f6")
            await pilot.pause()
            js = app.save_failed["stats"]
            assert ("Until then nothing is lost: the stats stay while the app runs, and every key that would "
                    "discard them asks first (Ctrl+Q, Ctrl+G).") in app.errors[-1][1]
            await pilot.press("escape")
            await _context_size(pilot, "3000")
            assert isinstance(app.screen, ConfirmContext)
            assert str(app.screen.query_one("#confirm-message").render()) == (
                f"Not saved, lost if you change the context size now:\n- the stats: F6 could not write {js}\n\n"
                f"Stay, make the folder writable (or free space) and press F6 again.")
            await pilot.click("#go")  # the "New size anyway" button
            await pilot.pause()
            await pilot.pause()
            assert not isinstance(app.screen, Confirm) and app.engine.info.n_ctx == 3000 and app.messages == []
            await _turn(pilot)
            await pilot.press("ctrl+n")  # the stats are kept by a new chat: nothing asked
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmNewChat) and app.messages == []
        await pilot.press("f6")  # saved: nothing left to ask about
        await pilot.pause()
        assert app.save_failed == {}
        await _turn(pilot)
        await _context_size(pilot, "4096")
        await pilot.pause()
        assert not isinstance(app.screen, Confirm) and app.engine.info.n_ctx == 4096 and app.messages == []


async def test_a_rejected_knob_value_is_quoted_as_typed_marked_invalid_and_the_value_in_force_returns(tmp_path):
    """A burst of input (a paste) into a knob field is kept as it came, even when it is not a number
    (it was dropped whole, the field left empty and the message saying "found nothing"); Enter
    quotes it and the value that stays; the rejected text is marked invalid (the field's
    background is the error colour, not the focus colour) until corrected; leaving the field shows
    the value in force again."""
    from textual import events
    from textual.widgets import Input

    app = _app(tmp_path)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot)
        await pilot.pause()
        threshold, max_draft = (app.query_one(f"#{i}", Input) for i in ("threshold", "max-draft"))
        toasts = lambda: [m.message for m in app._notifications]  # noqa: E731
        bg = lambda field: list(field.render_line(0))[-1].style.bgcolor  # (the blank after the text)  # noqa: E731
        # marked in the error colour: red, where the focus colour (the accent) is orange; Textual's own
        # mark of a compact field (a 20% tint) left it all but the same as a valid focused field's
        reddish = lambda c: c.triplet.red > 2 * c.triplet.green  # noqa: E731
        threshold.focus()
        await pilot.pause()
        focus_bg = bg(threshold)
        for burst, found in (("1.5 ", "1.5"), ("1,5", "1,5 (write the decimal point as '.')"), (" 2", "2")):
            threshold.value = ""  # (an empty field)
            app.post_message(events.Paste(burst))
            await pilot.pause()
            assert threshold.value == burst
            await pilot.press("enter")
            await pilot.pause()
            assert toasts()[-1] == (f"confidence threshold: a number in [0, 1], found {found}; "
                                    f"it stays 0.00 (Esc shows it again)")
            assert app.focused is threshold and threshold.has_class("-invalid")
            assert reddish(bg(threshold)) and not reddish(focus_bg)
        threshold.value = ""
        await pilot.press(*"0.5", "enter")  # corrected: applied
        await pilot.pause()
        assert app.engine.knobs.threshold == 0.5 and threshold.value == "0.50"

        max_draft.focus()
        await pilot.press("1", "5", "enter")  # (the focus selects the value: typing replaces it)
        await pilot.pause()
        assert toasts()[-1] == "max draft length: an integer 1..5, found 15; it stays 5 (Esc shows it again)"
        assert max_draft.value == "15" and max_draft.has_class("-invalid") and reddish(bg(max_draft))
        assert app.engine.knobs.max_draft == 5
        await pilot.press("tab")  # leaving the field: the value in force again
        await pilot.pause()
        assert app.focused is not max_draft and max_draft.value == "5" and not max_draft.has_class("-invalid")
        assert max_draft.render_line(0).text.strip() == "5"


@pytest.mark.parametrize("net_ms, saved_ms, shown", [
    (-3.0, -2.0, "net saved 0.00 s · saved 0.00 s"),  # a loss of 3 ms rounds to nothing: no "−0.00"
    (-0.0, 0.0, "net saved 0.00 s · saved 0.00 s"),
    (4.9, 4.9, "net saved 0.00 s · saved 0.00 s"),
    (-50.0, 10.0, "net saved −0.05 s · saved 0.01 s"),  # a real loss reads as one
    (280.0, 350.0, "net saved +0.28 s · saved 0.35 s"),
])
def test_the_throughput_pane_prints_no_negative_zero(net_ms, saved_ms, shown):
    from ds4tui.engine.stats import DSparkStats
    from ds4tui.widgets.speculation import ThroughputPane

    st = DSparkStats(t_decode_measured=True, net_saved=net_ms, saved=saved_ms)
    assert [str(c) for c in ThroughputPane._tail(st, 99, 4096)] == ["context 99/4096 tokens", shown]


async def test_ctrl_r_and_the_knobs_pane_switch_the_schedulers_policy(tmp_path):
    """The scheduler's policy (spec dspark.md §7.6) is a live knob: Ctrl+R switches it, the knobs pane's
    selector shows it and sets it (then the prompt has the keys again, as after Enter in a knob's field; Esc
    leaves the selector), and the note of an export's counters says it; an export written before the
    policy existed ran the acceptance policy, the only one there was, and is shown so; viewing an export
    while the selector has the focus gives the keys back to the prompt."""
    import json as _json

    from textual.widgets import Select

    app = _app(tmp_path)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot)
        sel = app.query_one("#policy", Select)
        prompt = app.query_one("#prompt")
        assert app.engine.knobs.policy == "confidence" and sel.value == "confidence" and not sel.disabled
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert app.engine.knobs.policy == "acceptance" and sel.value == "acceptance"
        for keys, want in ((("enter", "enter"), "acceptance"),  # the one shown: nothing changes, keys back
                           (("enter", "escape"), "acceptance"),  # one Esc closes the list and leaves it
                           (("escape",), "acceptance"),  # Esc on the closed selector leaves it
                           (("enter", "up", "enter"), "confidence")):  # the other one: applied
            sel.focus()
            await pilot.pause()
            await pilot.press(*keys)
            await pilot.pause()
            await pilot.pause()
            assert app.engine.knobs.policy == want and app.focused is prompt, keys
        await pilot.press("f3")  # the scheduler off: Ctrl+R says its policy decides nothing until F3
        await pilot.pause()
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert app.engine.knobs.policy == "acceptance"
        assert any("the scheduler is off: its policy decides nothing until F3 turns it on" in str(n.message)
                   for n in app._notifications)
        await pilot.press("f3", "ctrl+r")
        await pilot.pause()
        await _turn(pilot)
        await pilot.press("f6")
        await pilot.pause()
    export = next(tmp_path.glob("ds4tui-stats-*.json"))
    d = _json.loads(export.read_text())
    assert d["knobs"]["policy"] == "confidence"
    del d["knobs"]["policy"]
    export.write_text(_json.dumps(d))
    app = _app(tmp_path)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot)
        app.query_one("#policy", Select).focus()
        await pilot.pause()
        app.view_export(str(export))
        await pilot.pause()
        assert app.query_one("#policy", Select).value == "acceptance" and app.query_one("#policy").disabled
        assert app.focused is app.query_one("#prompt")
