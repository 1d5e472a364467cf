"""The app's own cost while an answer streams (ux.md §0 item 5): the light streaming widget, the
Markdown of finished blocks, the interpreter settings during a turn, and the cost the app reports.
Deterministic: a fake engine (tests/fake_chat.py), no timing assertions."""

from __future__ import annotations

import gc
import json
import sys
import threading
import time

import pytest
from fake_chat import ANSWER, FakeChatEngine
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.geometry import Region
from textual.widgets import Markdown

from ds4tui import app as A
from ds4tui.engine import worker as W
from ds4tui.engine.telemetry import FakeBackend, MemorySample
from ds4tui.widgets import chat as C
from ds4tui.widgets.pane import Pane
from ds4tui.widgets.stream import StreamText

RSS = MemorySample(t_mono_s=0.0, backend="rss", device="host", rss_b=300 << 20, host_total_b=8 << 30)


class _One(App):
    """A StreamText 30 cells wide (its content: 26, after the padding) in a 10-row view."""

    CSS = "VerticalScroll { width: 30; height: 10; } StreamText { padding: 0 2; }"

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield StreamText(id="s")


def _record_refreshes(w) -> list[tuple[tuple, bool]]:
    """Every ``w.refresh(*regions, layout=...)`` call from now on, as (regions, layout)."""
    calls: list[tuple[tuple, bool]] = []
    original = w.refresh

    def refresh(*regions, layout=False, **kw):
        calls.append((regions, layout))
        return original(*regions, layout=layout, **kw)

    w.refresh = refresh
    return calls


def _rows(w: StreamText) -> list[str]:
    return [w.render_line(y).text.rstrip() for y in range(w.size.height)]


def test_finished_blocks_end_at_blank_lines_and_closed_fences():
    fb = C.finished_blocks
    assert fb("") == 0 and fb("a paragraph still growing") == 0
    assert fb("one\n\ntwo") == len("one\n\n")
    text = "intro\n\n```python\ndef f():\n\n    return 1\n"  # a blank line inside a fence ends nothing
    assert fb(text) == len("intro\n\n")
    closed = text + "```\nafter"
    assert fb(closed) == len(text + "```\n")
    # a closing fence must use the opening character and be at least as long; ~~~ fences too
    assert fb("````\nx\n```\ny\n") == 0 and fb("````\nx\n`````\n") == len("````\nx\n`````\n")
    assert fb("~~~\nx\n```\n") == 0 and fb("~~~\nx\n~~~\n") == len("~~~\nx\n~~~\n")
    assert fb("```py\nx\n```  \n") == len("```py\nx\n```  \n")  # trailing spaces after a closing fence
    # from a start index (the text before it was handed to the Markdown already)
    assert fb("a\n\nb\n\nc", 3) == len("a\n\nb\n\n")


async def test_stream_text_wraps_appends_and_keeps_styles():
    app = _One()
    async with app.run_test() as pilot:
        w = app.query_one(StreamText)
        w.append("hello world, a line that wraps at the width\nsecond")
        await pilot.pause()
        assert w.size.width == 26 and w.row_count == 3
        assert _rows(w) == ["hello world, a line that", "wraps at the width", "second"]
        w.append(" line grows\nthird\n")
        await pilot.pause()
        assert _rows(w) == ["hello world, a line that", "wraps at the width", "second line grows", "third", ""]
        assert w.text == "hello world, a line that wraps at the width\nsecond line grows\nthird\n"
        w.append(Content.styled("bold", "bold"))
        await pilot.pause()
        assert _rows(w)[-1] == "bold"
        assert w.content.plain == w.text and [w.content.plain[s.start:s.end] for s in w.content.spans] == ["bold"]
        # control characters other than newline and tab cannot reach the terminal
        w.set("a\x1b[2Jb\tc\r\nd")
        await pilot.pause()
        assert w.text == "a\ufffd[2Jb\tc\nd"
        w.clear()
        await pilot.pause()
        assert w.text == "" and w.row_count == 0 and w.size.height == 0


async def test_stream_text_capped_shows_its_last_rows_without_a_new_layout():
    app = _One()
    async with app.run_test() as pilot:
        w = app.query_one(StreamText)
        w.max_rows = 4
        w.append("\n".join(f"line {k}" for k in range(3)))
        await pilot.pause()
        assert w.size.height == 3 and _rows(w) == ["line 0", "line 1", "line 2"]
        w.append("\nline 3\nline 4\nline 5")
        await pilot.pause()
        assert w.row_count == 6 and w.size.height == 4
        assert _rows(w) == ["line 2", "line 3", "line 4", "line 5"]
        calls = _record_refreshes(w)
        w.append(" and more\nline 6")  # the height stays 4: a repaint, no layout of the screen
        await pilot.pause()
        assert calls and not any(lay for _, lay in calls)
        assert _rows(w) == ["line 3", "line 4", "line 5 and more", "line 6"]
        w.max_rows = None
        await pilot.pause()
        assert w.size.height == 7 and _rows(w)[0] == "line 0"


async def test_hidden_stream_text_asks_for_no_frame_and_wraps_when_shown():
    app = _One()
    async with app.run_test() as pilot:
        w = app.query_one(StreamText)
        w.append("first")
        await pilot.pause()
        w.display = False
        await pilot.pause()
        calls = []
        original = w.refresh
        w.refresh = lambda *a, **kw: calls.append(kw) or original(*a, **kw)
        w.append(" more text\nand a second line")
        assert calls == []  # hidden: nothing to draw
        w.display = True
        await pilot.pause()
        assert _rows(w) == ["first more text", "and a second line"]


def _app(tmp_path, gate=None, **kw) -> A.DS4App:
    opts = A.ChatOptions(model="demo.gguf", support="demo-support.gguf", save_dir=tmp_path, think=False, **kw)
    return A.DS4App(opts, engine_factory=lambda o, progress: FakeChatEngine(o, gate=gate, hold_after=30),
                    telemetry=FakeBackend([RSS]), flush_s=None, memory_s=None)


async def _ask_and_stream(app, pilot, tokens: int = 30) -> None:
    """Ask the test engine's question and wait until it has decoded ``tokens`` tokens (the turn goes
    on: the tests hold it at their gate)."""
    app.query_one("#prompt").value = "Write a linked list"
    await pilot.press("enter")
    while app.engine._tokens < tokens:
        await pilot.pause(0.01)


class _Turn(App):
    """A transcript 60 cells wide and 8 rows tall holding a question and an answer."""

    CSS = "ChatView { width: 60; height: 8; }"

    def compose(self) -> ComposeResult:
        with C.ChatView():
            yield C.UserMessage("Write a linked list")
            yield C.AssistantMessage()


def _pieces(text: str, start: int = 0) -> list[W.TokenPiece]:
    return [W.TokenPiece(start + k, text[i:i + 4], k % 3 == 1, "answer") for k, i in enumerate(range(0, len(text), 4))]


async def test_the_answer_streams_below_the_question_and_finished_blocks_become_markdown_when_read_back(monkeypatch):
    monkeypatch.setattr(C, "MARKDOWN_S", 0.0)  # hand finished blocks over at every write
    app = _Turn()
    async with app.run_test(size=(80, 20)) as pilot:
        view, msg = app.query_one(C.ChatView), app.query_one(C.AssistantMessage)
        channel = msg._channels["answer"]
        head = "Here is a list:\n\n"
        await msg.add(_pieces(head))
        await pilot.pause()
        # the live text takes the rows below the question: 8 - the question and its margin (2) - the
        # message's margin (1) - summary (1), and the question's margin row (the view starts scrolled
        # past it: something to scroll back by); the question stays at the top of the view
        assert channel.live.max_rows == 5 and channel.live.reserve == 5 and channel.live.size.height == 5
        assert app.query_one(C.UserMessage).region.y == view.region.y and msg.region.bottom == view.region.bottom
        assert view.max_scroll_y == 1 and view.is_vertical_scroll_end
        height = msg.outer_size.height
        assert channel.live.text == head and channel.rendered == 0  # the text fits the view: no Markdown yet
        code = "```python\n" + "".join(f"x{k} = {k}\n" for k in range(8)) + "```\n\nEach"
        await msg.add(_pieces(code, 100))
        await pilot.pause()
        text = head + code
        assert msg.answer == text
        # the view follows the end: no Markdown while the answer streams, the live text shows its last
        # rows below the question, which stays in view (the message kept its height: no layout)
        assert not view.reading_back and view.is_vertical_scroll_end
        assert msg.outer_size.height == height and app.query_one(C.UserMessage).region.y == view.region.y
        shown = [channel.live.render_line(y).text.strip() for y in range(5)]
        assert "Each" in shown and channel.live.row_count > 5  # (scrolled in steps: blank rows may follow)
        assert channel.rendered == 0 and channel.markdown.source == "" and channel.live.text == text
        view.scroll_home(animate=False)  # the user scrolls back to read: the finished blocks become Markdown
        await pilot.pause()
        assert view.reading_back
        await msg.add(_pieces(" node", 200))
        await pilot.pause()
        text += " node"
        done = C.finished_blocks(text)
        assert done == len(text) - len("Each node")  # the fence closed: all but the last words is finished
        assert channel.rendered == done and channel.markdown.source == text[:done] and channel.live.text == "Each node"
        view.scroll_end(animate=False)  # back at the end: the transcript follows the answer again
        await pilot.pause()
        assert not view.reading_back
        await msg.add(_pieces("\n\nMore", 300))
        await pilot.pause()
        text += "\n\nMore"
        assert channel.rendered == done and channel.live.text == "Each node\n\nMore"
        await msg.finish("done")
        await pilot.pause()
        assert channel.markdown.source == text and channel.live.text == "" and channel.live.reserve == 0
        # the message is as tall as its text (no reserved rows left), its end at the view's bottom
        assert msg.outer_size.height == channel.markdown.outer_size.height + 1
        assert msg.query_one("#summary").render().plain == "done" and view.is_vertical_scroll_end


class _LongQuestion(App):
    """A transcript 60 cells wide and 8 rows tall holding a 4-row question and an answer."""

    CSS = "ChatView { width: 60; height: 8; }"

    def compose(self) -> ComposeResult:
        with C.ChatView():
            yield C.UserMessage("line 1\nline 2\nline 3\nline 4")
            yield C.AssistantMessage()


async def test_below_a_long_question_the_answer_grows_past_its_rows():
    app = _LongQuestion()
    async with app.run_test(size=(80, 20)) as pilot:
        view, msg = app.query_one(C.ChatView), app.query_one(C.AssistantMessage)
        live = msg._channels["answer"].live
        await msg.add(_pieces("first"))
        await pilot.pause()
        # 8 - the question and its margin (5) - the message's margin and summary (2): 1 row, under
        # half the view, so the answer may take the whole view
        assert live.reserve == 1 and live.max_rows == 8
        await msg.add(_pieces("".join(f"\nrow {k}" for k in range(6)), 100))
        await pilot.pause()
        assert live.size.height > 1 and view.is_vertical_scroll_end and msg.region.bottom == view.region.bottom


async def test_a_turn_runs_with_the_interpreter_settings_for_streaming_and_restores_them(tmp_path):
    gate = threading.Event()
    app = _app(tmp_path, gate)
    before = sys.getswitchinterval(), gc.get_threshold()
    async with app.run_test(size=(150, 48)) as pilot:
        await app.workers.wait_for_complete()
        await app.flush()
        await _ask_and_stream(app, pilot)
        assert sys.getswitchinterval() == pytest.approx(A.SWITCH_S) and gc.get_threshold() == A.GC_THRESHOLDS
        prompt = app.query_one("#prompt")
        assert not prompt.cursor_blink  # a steady cursor while the engine decodes: no frame per blink
        panes = list(app.query(Pane))
        assert len(panes) == 8 and all(p._held is not None for p in panes)  # no pane gets shorter
        gate.set()
        await app.workers.wait_for_complete()
        await app.flush()
        assert (sys.getswitchinterval(), gc.get_threshold()) == before and prompt.cursor_blink
        assert all(p._held is None for p in panes)


async def test_while_a_turn_runs_memory_is_sampled_with_the_panes(tmp_path):
    gate = threading.Event()
    app = _app(tmp_path, gate)
    async with app.run_test(size=(150, 48)) as pilot:
        await app.workers.wait_for_complete()
        await app.flush()
        app.memory_s = A.MEMORY_S  # (no timer here: _tick is called by hand)
        await _ask_and_stream(app, pilot)
        sampled = []
        original = app.sample_memory
        app.sample_memory = lambda: sampled.append(app._generating) or original()
        app._memory_t = time.monotonic() - 1.5 * A.MEMORY_S  # due when idle; while a turn runs the panes bring it
        await app._tick()
        assert sampled == []
        app._panes_t = time.monotonic() - A.PANES_S  # the panes are due: memory is drawn with them
        app._apply_snapshot(app.engine.snapshot(generating=True))
        assert sampled == [True]
        # no pane redraw for twice the panes' period: sampled anyway
        app._memory_t = time.monotonic() - 2.5 * max(A.MEMORY_S, A.PANES_S)
        await app._tick()
        assert sampled == [True, True]
        gate.set()
        await app.workers.wait_for_complete()
        await app.flush()
        app._memory_t = time.monotonic() - 1.5 * A.MEMORY_S
        await app._tick()  # the turn is over: every MEMORY_S again
        assert sampled == [True, True, False]


async def test_the_app_reports_its_own_cost(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=(150, 48)) as pilot:
        await app.workers.wait_for_complete()
        await app.flush()
        for k in range(2):
            app.query_one("#prompt").value = f"question {k}"
            await pilot.press("enter")
            await app.workers.wait_for_complete()
            await app.flush()  # every event of the turn in one flush: one text write
        assert len(app.turn_costs) == len(app.turns) == 2
        assert [c.text_writes for c in app.turn_costs] == [1, 1] and app.ui_cost.text_writes == 2
        assert app.ui_cost.wall_s == sum(c.wall_s for c in app.turn_costs) < A.MIN_COST_S
        assert app.ui_cost.cpu_share is None  # too short to say
        assert "interface cost: measured while streaming" in app.query_one("#throughput").text
        # the stats export and the saved transcript carry it
        await pilot.press("f6")
        await pilot.press("ctrl+s")
        await pilot.pause()
        stats = json.loads(next(tmp_path.glob("ds4tui-stats-*.json")).read_text())
        assert stats["interface"] == app.ui_cost.to_dict() and stats["interface"]["text_writes"] == 2
        saved = json.loads(next(tmp_path.glob("ds4tui-chat-*.json")).read_text())
        assert [m["interface"] for m in saved["messages"] if m["role"] == "assistant"] == [
            c.to_dict() for c in app.turn_costs]
        # answers that streamed less than MIN_COST_S: the pane says how long so far
        app.ui_cost = A.InterfaceCost(cpu_s=0.05, wall_s=0.4, text_writes=3, max_text_gap_s=0.2)
        app._apply_snapshot(app.engine.snapshot(generating=False))
        assert "interface cost: after 1 s; 0.4 s streamed" in app.query_one("#throughput").text
        assert max(map(len, app.query_one("#throughput").text.splitlines())) <= 41  # one row of a 43-column pane
        # once answers have streamed long enough the pane shows the share: CPU seconds per second
        app.ui_cost = A.InterfaceCost(cpu_s=0.25, wall_s=2.0, text_writes=10, max_text_gap_s=0.2)
        assert app.ui_cost.cpu_share == 0.125 and app.ui_cost.text_writes_per_s == 5.0
        app._apply_snapshot(app.engine.snapshot(generating=False))
        assert "interface 12.5% of a core while streaming" in app.query_one("#throughput").text


def test_interface_cost_adds_up():
    a = A.InterfaceCost(cpu_s=0.1, wall_s=1.0, text_writes=5, max_text_gap_s=0.2)
    a.add(A.InterfaceCost(cpu_s=0.3, wall_s=1.0, text_writes=6, max_text_gap_s=0.25))
    assert (a.cpu_s, a.wall_s, a.text_writes, a.max_text_gap_s) == (0.4, 2.0, 11, 0.25)
    assert a.cpu_share == 0.2 and a.text_writes_per_s == 5.5
    d = a.to_dict()
    assert d["cpu_share"] == 0.2 and d["text_writes"] == 11 and set(d) == {
        "cpu_s", "wall_s", "cpu_share", "text_writes", "text_writes_per_s", "max_text_gap_s"}


async def test_stream_text_outgrows_its_reserve_in_steps_and_repaints_only_rows_of_text():
    app = _One()
    async with app.run_test() as pilot:
        w = app.query_one(StreamText)
        w.reserve, w.grow_step = 3, 4
        w.append("line 0")
        await pilot.pause()
        assert w.size.height == 3  # the reserve: text at the top, blank rows below
        regions = _record_refreshes(w)
        w.append(" grows")  # one row changed: that row is repainted, not the blank ones below it
        assert regions == [((Region(0, 0, 26, 1),), False)]
        w.append("\nline 1\nline 2\nline 3")  # 4 rows: past the reserve by one, the widget takes 4 more
        await pilot.pause()
        assert w.size.height == 7 and _rows(w)[:4] == ["line 0 grows", "line 1", "line 2", "line 3"]
        regions.clear()
        w.append("\nline 4\nline 5\nline 6")  # 7 rows: within the step, no layout
        assert regions and not any(layout for _, layout in regions)
        w.max_rows = 9
        w.append("\nline 7\nline 8\nline 9")  # the next step is capped at max_rows
        await pilot.pause()
        # 10 rows in 9: the text scrolls a step (4 rows) at once, its last row 3 rows above the bottom
        assert w.size.height == 9 and _rows(w) == [f"line {k}" for k in range(4, 10)] + ["", "", ""]


async def test_capped_stream_text_scrolls_in_steps_and_repaints_only_new_rows_between_them():
    app = _One()
    async with app.run_test() as pilot:
        w = app.query_one(StreamText)
        w.max_rows, w.grow_step = 4, 3
        w.append("\n".join(f"line {k}" for k in range(4)))
        await pilot.pause()
        assert w.size.height == 4 and _rows(w) == ["line 0", "line 1", "line 2", "line 3"]
        regions = _record_refreshes(w)
        w.append("\nline 4")  # past the cap: one scroll of 3 rows, every row shown repainted
        await pilot.pause()
        assert regions == [((), False)] and _rows(w) == ["line 3", "line 4", "", ""]
        regions.clear()
        w.append(" grows\nline 5")  # within the step: its rows only
        await pilot.pause()
        assert regions == [((Region(0, 1, 26, 2),), False)] and _rows(w) == ["line 3", "line 4 grows", "line 5", ""]
        regions.clear()
        w.append("\nline 6\nline 7")  # one row over: the next scroll
        await pilot.pause()
        assert regions == [((), False)] and _rows(w) == ["line 6", "line 7", "", ""]
        # a step never hides text it could show: a larger cap shows the rows above again
        w.max_rows = 6
        await pilot.pause()
        assert _rows(w) == ["line 4 grows", "line 5", "line 6", "line 7", "", ""]
        w.max_rows = None
        await pilot.pause()
        assert w.size.height == 8 and _rows(w)[0] == "line 0" and _rows(w)[-1] == "line 7"
        w.set("short")  # a new text starts at the top
        await pilot.pause()
        assert _rows(w) == ["short"]


async def test_typing_in_the_prompt_repaints_the_line_without_a_layout(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=(80, 30)) as pilot:  # the placeholder is wider than the prompt
        await app.workers.wait_for_complete()
        await app.flush()
        await pilot.pause()
        prompt = app.query_one("#prompt")
        layouts = []
        original = app.screen._refresh_layout
        app.screen._refresh_layout = lambda *a, **kw: layouts.append(a) or original(*a, **kw)
        await pilot.press(*"linked")
        await pilot.pause()
        assert prompt.value == "linked" and layouts == []
        prompt.insert_text_at_cursor("x" * 100)  # longer than the line: it scrolls to keep the cursor in view
        await pilot.press("y")
        await pilot.pause()
        region = prompt.content_region  # (the cursor after the last character may sit in the padding, as in Input)
        assert prompt.scroll_x == prompt.max_scroll_x > 0 and region.x <= prompt.cursor_screen_offset.x <= region.right
        await pilot.press("ctrl+u", "z")  # short again: back at the start
        await pilot.pause()
        assert prompt.value == "z" and prompt.scroll_x == 0


async def test_the_engine_decodes_once_the_question_is_laid_out(tmp_path, monkeypatch):
    monkeypatch.setattr(A, "SETTLE_MAX_S", 3600.0)  # (a fallback; here the frames must end the wait)
    app = _app(tmp_path)
    seen = []
    async with app.run_test(size=(150, 48)) as pilot:
        await app.workers.wait_for_complete()
        await app.flush()
        run_turn = app.engine.run_turn

        def spy(*a, before_decode, **kw):
            def gate():  # (after the prefill)
                before_decode()
                live = app.current._channels["answer"].live
                seen.append((live.reserve, live.max_rows))

            return run_turn(*a, before_decode=gate, **kw)

        app.engine.run_turn = spy
        app.query_one("#prompt").value = "Write a linked list"
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await app.flush()
        # its rows were reserved (below this short question: as many as it may ever take while it streams)
        assert len(seen) == 1 and seen[0][0] > 0 and seen[0][1] == seen[0][0]
        assert app.turns and app.turns[-1].answer == ANSWER


async def test_esc_while_the_question_is_laid_out_ends_the_turn_before_it_decodes(tmp_path, monkeypatch):
    monkeypatch.setattr(A, "SETTLE_MAX_S", 3600.0)
    app = _app(tmp_path)
    async with app.run_test(size=(150, 48)) as pilot:
        await app.workers.wait_for_complete()
        await app.flush()
        run_turn, waiting, frames = app.engine.run_turn, threading.Event(), []

        def spy(*a, before_decode, **kw):
            def gate():
                waiting.set()
                before_decode()

            return run_turn(*a, before_decode=gate, **kw)

        app.engine.run_turn = spy
        # no frame passes: only Esc ends the wait
        app.call_after_refresh = lambda callback, *a, **kw: frames.append(callback)
        app.query_one("#prompt").value = "Write a linked list"
        await pilot.press("enter")
        while not waiting.is_set():  # the prefill is done, decoding waits for the layout
            await pilot.pause(0.01)
        await pilot.press("escape")
        await app.workers.wait_for_complete()
        await app.flush()
        assert frames and app.engine._tokens == 0 and app.turns == [] and app.messages == []
        summary = app.query(C.AssistantMessage).last().query_one("#summary").render().plain
        assert "stopped before the answer began" in summary


async def test_the_prefill_bar_leaves_the_screen_before_the_engine_decodes(tmp_path, monkeypatch):
    monkeypatch.setattr(A, "SETTLE_MAX_S", 3600.0)  # (a fallback; here the frames must end the wait)
    app = _app(tmp_path)
    seen = []
    async with app.run_test(size=(150, 48)) as pilot:
        await app.workers.wait_for_complete()
        await app.flush()
        bar, view = app.query_one("#progress"), app.query_one("#transcript")
        rows = view.region.height  # the transcript's rows without the bar
        run_turn = app.engine.run_turn

        def spy(*a, before_decode, **kw):
            def gate():  # (after the prefill)
                # a flush during a long prefill drew its progress: the bar takes a row of the transcript
                app.call_from_thread(app._progress, W.PrefillProgress(1, 10, 40, 0))
                seen.append((bar.has_class("active"), "prefill 10/40" in app.query_one("#status").render().plain))
                before_decode()
                seen.append((bar.has_class("active"), view.region.height, app.query_one("#status").render().plain))

            return run_turn(*a, before_decode=gate, **kw)

        app.engine.run_turn = spy
        app.query_one("#prompt").value = "Write a linked list"
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        added = []
        original = bar.add_class
        bar.add_class = lambda *c, **kw: added.append(c) or original(*c, **kw)
        await app.flush()  # the queued progress (40/40, then the text) is not drawn again
        assert seen[0] == (True, True)
        # before the first decode cycle the bar had gone and the screen was laid out without it
        assert seen[1][:2] == (False, rows) and seen[1][2].startswith("generating")
        assert added == [] and not bar.has_class("active")
        assert app.turns and app.turns[-1].answer == ANSWER


async def test_the_hidden_progress_bar_runs_no_timer(tmp_path):
    from textual.widgets._progress_bar import Bar

    app = _app(tmp_path)
    async with app.run_test(size=(150, 48)):
        await app.workers.wait_for_complete()
        await app.flush()
        bar = app.query_one("#progress", A.PrefillBar)
        assert bar.query_one(Bar).auto_refresh is None  # a total from the start: never the animation
        timers = bar._own_timers  # (ProgressBar's own: the percentage redrawn every second)
        assert len(timers) == 1 and not bar.has_class("active") and not timers[0]._active.is_set()
        app.queue.put(W.PrefillProgress(1, 10, 40, 0))
        await app.flush()
        assert bar.has_class("active") and timers[0]._active.is_set() and bar.percentage == 0.25
        app._progress(None)
        assert not bar.has_class("active") and not timers[0]._active.is_set()


async def test_the_screen_draws_a_frame_when_asked_and_runs_no_timer_between_frames(tmp_path):
    import asyncio

    from ds4tui.widgets.pane import set_line
    from ds4tui.widgets.screen import ChatScreen, FrameTrigger

    app = _app(tmp_path)
    async with app.run_test(size=(150, 48)) as pilot:
        await app.workers.wait_for_complete()
        await app.flush()
        app.query_one("#prompt").cursor_blink = False  # (each blink is a frame of its own, twice a second)
        await pilot.pause()  # (the loaded model's screen drawn)
        screen = app.screen
        trigger = screen._update_timer
        assert isinstance(screen, ChatScreen) and isinstance(trigger, FrameTrigger)
        assert not any(t.name == "screen_update" for t in screen._timers)  # Textual's would wake after each frame
        frames = []
        display = app._display

        def counted(s, renderable):
            frames.append(renderable)
            display(s, renderable)

        app._display = counted
        set_line(app.query_one("#status"), "a new status line")  # a change: one frame asked for
        for _ in range(100):  # (no pilot: its pause draws the frame itself)
            await asyncio.sleep(0.01)
            if frames and not trigger.scheduled:
                break
        assert len(frames) == 1 and not trigger.scheduled
        assert "a new status line" in app.query_one("#status").render().plain
        trigger.resume()
        trigger.resume()  # one frame at a time is scheduled
        assert trigger.scheduled
        trigger.pause()  # (the screen drew, or laid out: the frame is not needed)
        assert not trigger.scheduled


async def test_a_prefill_that_text_follows_in_one_flush_is_not_drawn(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=(150, 48)) as pilot:
        await app.workers.wait_for_complete()
        await app.flush()
        bar = app.query_one("#progress")
        app.queue.put(W.PrefillProgress(1, 10, 40, 0))
        await app.flush()
        assert bar.has_class("active") and "prefill 10/40 tokens" in app.query_one("#status").render().plain
        app._set_status()
        app.current = C.AssistantMessage()
        await app.query_one(C.ChatView).mount(app.current)
        app.queue.put(W.PrefillProgress(1, 20, 40, 0))
        app.queue.put(W.PrefillProgress(1, 40, 40, 0))
        app.queue.put(W.TokensEmitted(1, (W.TokenPiece(0, "Here", False, "answer"),)))
        classes = []
        original = bar.add_class
        bar.add_class = lambda *c, **kw: classes.append(c) or original(*c, **kw)
        await app.flush()
        assert classes == [] and not bar.has_class("active")  # the prefill was over: never shown again
        assert app.current.answer == "Here"


class _Panes(App):
    """One pane 30 cells wide (26 inside its border and padding) above a prompt."""

    CSS = "Pane { width: 30; }"

    def compose(self) -> ComposeResult:
        yield Pane("test", id="p")


def _pane_rows(w: Pane) -> list[str]:
    return [line.rstrip() for line in w.render().plain.split("\n")]


async def test_a_held_pane_keeps_its_height_and_a_shorter_text_costs_no_layout():
    app = _Panes()
    async with app.run_test(size=(40, 20)) as pilot:
        w = app.query_one(Pane)
        w.put(Content("a\nb\nc"))
        await pilot.pause()
        assert w.content_size.height == 3
        calls = _record_refreshes(w)
        w.hold(True)
        w.put(Content("one"))  # a row shorter, held: blank rows below it, a repaint only
        await pilot.pause()
        assert [lay for _, lay in calls] == [False] and w.content_size.height == 3 and w.text == "one"
        assert _pane_rows(w) == ["one", "", ""]
        w.put(Content("a line that wraps: longer than its twenty-six cells"))  # 2 rows: still within 3
        w.put(Content("1\n2\n3\n4"))  # taller: a layout, and the new height is held
        await pilot.pause()
        assert [lay for _, lay in calls] == [False, False, True] and w.content_size.height == 4
        w.put(Content("x"))
        await pilot.pause()
        assert calls[-1][1] is False and w.content_size.height == 4
        w.hold(False)  # released: as tall as its text (a layout)
        await pilot.pause()
        assert calls[-1][1] is True and w.content_size.height == 1 and _pane_rows(w) == ["x"]


async def test_a_pane_repaints_only_the_rows_whose_text_changed():
    app = _Panes()
    async with app.run_test(size=(40, 20)) as pilot:
        w = app.query_one(Pane)
        w.put(Content("rate 1.0\nsame row\ncount 5"))
        await pilot.pause()
        calls = _record_refreshes(w)
        w.put(Content.assemble("rate ", ("2.0", "bold"), "\nsame row\ncount 5"))  # row 0 (text and style)
        w.put(Content.assemble("rate ", ("2.0", "bold"), "\nsame row\ncount 6"))  # row 2
        assert calls == [((Region(0, 0, 26, 1),), False), ((Region(0, 2, 26, 1),), False)]
        await pilot.pause()
        strips = w.render_lines(Region(0, 0, 30, 5))  # the border, three rows, the border
        assert [strip.text[2:-2].rstrip() for strip in strips[1:4]] == ["rate 2.0", "same row", "count 6"]
        assert w.text == "rate 2.0\nsame row\ncount 6"


async def test_the_panes_before_the_first_cycle_are_as_tall_as_with_cycles():
    from ds4tui.engine.stats import NO_DRAFT_REASONS, DSparkStats
    from ds4tui.widgets.histogram import Histogram
    from ds4tui.widgets.speculation import NoDraftPane, StagesPane

    zero = DSparkStats(block_size=5, draft_len_hist=(0,) * 6, accepted_len_hist=(0,) * 6)

    class Three(App):
        def compose(self) -> ComposeResult:
            yield Histogram("h", id="h")
            yield StagesPane("s", id="s")
            yield NoDraftPane("n", id="n")

    app = Three()
    async with app.run_test(size=(60, 50)):
        h, st, nd = app.query_one(Histogram), app.query_one(StagesPane), app.query_one(NoDraftPane)
        h.show(zero.draft_len_hist)
        assert h.text.split("\n") == [f"{n:>2} {'':6}{0:>5}{0:4.0f}%" for n in range(6)]  # every bin, at 0
        h.show(())
        assert h.text == "no cycles yet"
        st.show(zero)
        lines = st.text.split("\n")
        # the drafter's steps the cpu backend times, as the pane lists them once cycles run (prop_stage0,
        # which this engine never times, was listed only until then)
        cpu = ["prop_setup", "prop_cache", "prop_chain", "prop_hidden", "prop_conf0", "prop_logits", "prop_markov",
               "prop_confidence"]
        assert len(lines) == len(cpu) + 5 and lines[0] == "ms per drafter pass (no cycles yet)"
        assert [line.split()[0] for line in lines[1:1 + len(cpu)]] == cpu
        assert all(line.endswith("—") for line in lines[1:] if not line.startswith("ms per"))
        st.show(zero, backend="hip")  # the GPU times the embedding, the stages and the HC head as prop_chain
        assert [line.split()[0] for line in st.text.split("\n")[1:7]] == [
            "prop_cache", "prop_chain", "prop_conf0", "prop_logits", "prop_markov", "prop_confidence"]
        nd.show(zero)
        assert nd.text.split("\n") == ["no cycles yet"] + [f"{name:<16}{0:>7}" for name in NO_DRAFT_REASONS]


async def test_the_no_draft_pane_names_every_reason_tied_for_the_top():
    """On a tie the pane used to mark the first reason in index order as dominant, one of several equal
    ones; it marks every tied one, names them together and says what to do about each."""
    from ds4tui.engine.stats import NO_DRAFT_HELP, DSparkStats
    from ds4tui.widgets.speculation import NoDraftPane, dominant_words

    tied = DSparkStats(cycles=10, first_tokens=10, no_draft=9, scheduler_skips=4, tail_skips=4, no_room=1,
                       no_draft_reasons={"scheduler_skip": 4, "tail_skip": 4, "no_room": 1})
    one = DSparkStats(cycles=10, first_tokens=10, no_draft=10, scheduler_skips=4, tail_skips=3, no_room=2,
                      no_draft_reasons={"disabled": 1, "scheduler_skip": 4, "tail_skip": 3, "no_room": 2})

    class One(App):
        def compose(self) -> ComposeResult:
            yield NoDraftPane("n", id="n")

    async with One().run_test(size=(60, 30)) as pilot:
        nd = pilot.app.query_one(NoDraftPane)
        nd.show(tied)
        assert nd.text.split("\n") == [
            "no_draft 9 of 10 cycles",
            f"{'scheduler_skip':<16}{4:>7}  ◀ tied",
            f"{'tail_skip':<16}{4:>7}  ◀ tied",
            f"{'no_room':<16}{1:>7}",
            "dominant: scheduler_skip = tail_skip (4 each)",
            "→ scheduler_skip: " + NO_DRAFT_HELP["scheduler_skip"][1],
            "→ tail_skip: " + NO_DRAFT_HELP["tail_skip"][1],
            "F1 explains every reason",
        ]
        nd.show(one)  # one reason on top: as before
        assert nd.text.split("\n") == [
            "no_draft 10 of 10 cycles",
            f"{'disabled':<16}{1:>7}",
            f"{'scheduler_skip':<16}{4:>7}  ◀ dominant",
            f"{'tail_skip':<16}{3:>7}",
            f"{'no_room':<16}{2:>7}",
            "→ " + NO_DRAFT_HELP["scheduler_skip"][1],
            "F1 explains every reason",
        ]
        # the knobs in force now: a dominant reason they removed is past, not advice to press the key again
        from ds4tui.engine.backend import DSparkKnobs

        nd.show(one, knobs=DSparkKnobs(scheduler=False))
        assert "→ The scheduler is off now (F3): these skips are from before, and every cycle from here drafts" \
            in nd.text
        assert "F3 turns the scheduler off" not in nd.text
        nd.show(one, knobs=DSparkKnobs(scheduler=True))
        assert "→ " + NO_DRAFT_HELP["scheduler_skip"][1] in nd.text
        nd.show(one, knobs=DSparkKnobs(enabled=False, scheduler=False))  # both off: no key to press twice
        assert ("→ The scheduler is off now (F3): these skips are from before; DSpark is off now as well (F2 turns it "
                "on)") in nd.text and "F3 turns the scheduler off" not in nd.text
        gated = DSparkStats(cycles=4, first_tokens=4, no_draft=3, no_draft_reasons={"confidence_gate": 3})
        nd.show(gated, knobs=DSparkKnobs(threshold=0.0))
        assert "→ The threshold is 0 now: these cycles are from before, and no draft is gated from here" in nd.text
    assert dominant_words(one) == "scheduler_skip (4 cycles)" and dominant_words(DSparkStats()) == ""


async def test_the_summary_line_is_redrawn_at_most_every_summary_s(monkeypatch):
    monkeypatch.setattr(C, "SUMMARY_S", 3600.0)
    app = _Turn()
    async with app.run_test(size=(80, 20)) as pilot:
        msg = app.query_one(C.AssistantMessage)
        summary = msg.query_one("#summary")
        await msg.add(_pieces("Here is"))
        await msg.add(_pieces(" a list", 10))
        await pilot.pause()
        assert msg.n_tokens == 4 and summary.render().plain == "2 tokens · 1 from accepted drafts"
        await msg.finish("done")
        assert summary.render().plain == "done"


async def test_ui_tax_times_the_frames_that_show_the_answer_and_a_typed_key(tmp_path):
    from ds4tui.devtools import ui_tax

    gate = threading.Event()
    app = _app(tmp_path, gate)
    async with app.run_test(size=(150, 48)) as pilot:
        await app.workers.wait_for_complete()
        await app.flush()
        frames = ui_tax._Frames(app)
        await _ask_and_stream(app, pilot)
        await app.flush()  # the text so far: one write
        await pilot.pause()
        await frames.type_key()  # acted on (the prompt holds it), then drawn
        assert app.query_one("#prompt").value == "x"
        assert len(frames.key_ms) == len(frames.key_frame_ms) == 1 and 0 < frames.key_ms[0] <= frames.key_frame_ms[0]
        shown = [n for _, n in frames.frames]
        assert app.current.n_tokens > 0 and app.current.n_tokens in shown  # a frame showed the text written
        gate.set()
        await app.workers.wait_for_complete()
        await app.flush()
    # the rate counts frames that show more of the answer than the frame before, from the first to the last
    frames.frames = [(0.0, -1), (0.1, 0), (0.2, 5), (0.3, 5), (0.4, 9), (0.6, 9), (1.2, 20), (1.3, -1)]
    rate, gap, n = frames.text_rate()
    assert n == 3 and rate == pytest.approx(2 / 1.0) and gap == pytest.approx(0.8)


async def test_an_answers_code_block_without_a_language_is_drawn_plain_not_guessed(monkeypatch):
    import textual.highlight

    def guess(*a, **kw):
        raise AssertionError("the language of a code block was guessed")

    monkeypatch.setattr(textual.highlight, "guess_language", guess)
    app = _Turn()
    async with app.run_test(size=(80, 20)) as pilot:
        md = app.query_one("#answer", C.AnswerMarkdown)
        await md.update("Plain:\n\n```\nx = 1\n```\n\n    indented = 2\n\nNamed:\n\n```python\ndef f():\n    return 1\n```\n")
        await pilot.pause()
        fences = list(md.query(C.Fence))
        assert [f.code for f in fences] == ["x = 1", "indented = 2", "def f():\n    return 1"]
        plain, indented, named = (f._highlighted_code for f in fences)
        assert plain.plain == "x = 1" and indented.plain == "indented = 2" and named.plain.startswith("def f():")
        styles = [{str(s.style) for s in c.spans} - {"$text"} for c in (plain, indented, named)]
        assert styles[0] == styles[1] == set() and styles[2]  # python highlighted, the rest plain


async def test_a_code_line_wider_than_the_pane_shows_a_scrollbar_under_its_block_and_scrolls():
    app = _Turn()
    async with app.run_test(size=(60, 30)) as pilot:
        md = app.query_one("#answer", C.AnswerMarkdown)
        wide = "x = " + " + ".join(str(i) for i in range(40))  # 150 columns
        await md.update(f"Short:\n\n```python\ny = 1\n```\n\nWide:\n\n```python\n{wide}\n```\n")
        await pilot.pause()
        short, long = md.query(C.Fence)
        assert not short.show_horizontal_scrollbar and short.max_scroll_x == 0
        assert long.show_horizontal_scrollbar and long.scrollbar_size_horizontal == 1  # the mark of a cut line
        assert long.max_scroll_x > 0
        long.scroll_to(x=long.max_scroll_x, animate=False)
        await pilot.pause()
        assert long.scroll_x == long.max_scroll_x  # the rest of the line can be seen


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/task is Linux's")
def test_ui_tax_counts_a_threads_sleeps_as_its_wake_ups():
    from ds4tui.devtools import ui_tax

    me = threading.get_native_id()
    before, others = ui_tax.thread_switches(-me), ui_tax.thread_switches(me)
    time.sleep(0.01)  # one sleep: one voluntary switch of this thread at least
    after = ui_tax.thread_switches(-me)
    assert after[0] >= before[0] + 1 and after[1] >= before[1]
    assert others is not None and all(n >= 0 for n in others)
    assert ui_tax.thread_switches(-(2 ** 31 - 1)) is None  # (no such thread)


def test_ui_tax_refuses_a_file_that_is_not_a_model_in_one_line(tmp_path, capsys):
    from ds4tui.devtools import ui_tax

    fake = tmp_path / "fake.gguf"
    fake.write_text("hello\n")
    assert ui_tax.main([str(fake)]) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err == (f"python -m ds4tui.devtools.ui_tax: error: {fake}: not a GGUF file: 6 bytes "
                                         f"beginning b'hell' (a GGUF begins with b'GGUF')\n")
    with pytest.raises(SystemExit) as e:  # a bad flag: argparse's usage error
        ui_tax.main([str(fake), "--tokens", "0"])
    assert e.value.code == 2 and "argument --tokens: expected a positive integer, found 0" in capsys.readouterr().err


def test_ui_tax_refuses_a_blank_prompt(tmp_path, capsys):
    from ds4tui.devtools import ui_tax

    with pytest.raises(SystemExit) as e:
        ui_tax.main([str(tmp_path / "m.gguf"), "--prompt", "  "])
    assert e.value.code == 2
    assert "argument --prompt: expected a question, found an empty or blank text" in capsys.readouterr().err


async def test_a_partial_frame_renders_only_its_rows_and_sends_what_textuals_compositor_sends(tmp_path):
    from textual._compositor import ChopsUpdate, Compositor

    from ds4tui.widgets.screen import ChatScreen, RowCropCompositor

    gate = threading.Event()
    app = _app(tmp_path, gate)
    async with app.run_test(size=(150, 48)) as pilot:
        await app.workers.wait_for_complete()
        await app.flush()
        await _ask_and_stream(app, pilot)
        await app.flush()  # the answer so far, the panes with their figures
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ChatScreen) and isinstance(screen._compositor, RowCropCompositor)
        ours = screen._compositor
        theirs = Compositor.__new__(Compositor)  # Textual's compositor on the same map
        theirs.__dict__.update(ours.__dict__)
        width, height = ours.size
        answer, pane = app.query_one("#answer-live").region, app.query_one("#stages").region
        seen: list[tuple[str, int, int]] = []  # (widget id, first row, rows) of each render
        original = ours._span_renders

        def count(crop, spans):
            widgets = {id(r): w for w, (r, _) in ours.visible_widgets.items()}
            for region, clip, strips in original(crop, spans):
                seen.append((widgets[id(region)].id, clip.y, len(strips)))
                yield region, clip, strips

        ours._span_renders = count
        text_rows = Region(answer.x, answer.y + 2, answer.width, 3)
        pane_row = Region(pane.x, pane.y + 1, pane.width, 1)
        updates = [[text_rows], [text_rows, pane_row], [Region(0, 0, width, height)], [Region(10, 0, 1, 1)],
                   [Region(0, height - 3, width, 3)], [Region(60, 10, 80, 30), Region(3, 5, 50, 4)]]
        for regions in updates:
            seen.clear()
            # what each compositor's partial update of these regions writes to the terminal
            ours._dirty_regions.update(regions)
            mine = ours.render_partial_update()
            spans = list(Compositor._regions_to_spans(regions))
            rows = {y for y, _, _ in spans}
            stock = ChopsUpdate(Compositor._render_chops(theirs, Region.from_union(regions), rows.__contains__),
                                spans, [cut_set[1:] for cut_set in theirs.cuts])
            assert mine.spans == spans and mine.render_segments(app.console) == stock.render_segments(app.console)
            assert all(first in rows and n <= len(rows) for _, first, n in seen), (regions, seen)
            if text_rows in regions:  # not the containers behind the text or the pane: their rows there never show
                assert not [w for w, _, _ in seen if w in ("transcript", "chat-column", "main", "side", "side-b")]
            if regions == [text_rows, pane_row]:  # each widget only in the changed rows within its columns
                assert ("answer-live", answer.y + 2, 3) in seen and ("stages", pane.y + 1, 1) in seen
                assert not [w for w, first, _ in seen if w == "answer-live" and first == pane.y + 1]
                assert not [w for w, first, _ in seen if w == "stages" and first != pane.y + 1]
        gate.set()
        await app.workers.wait_for_complete()
        await app.flush()


async def test_a_pane_renders_a_repainted_row_alone_and_each_row_as_textuals_render_of_the_whole_pane(tmp_path):
    from textual.widget import Widget

    gate = threading.Event()
    app = _app(tmp_path, gate)
    async with app.run_test(size=(150, 48)) as pilot:
        await app.workers.wait_for_complete()
        await app.flush()
        await _ask_and_stream(app, pilot)
        await app.flush()  # the panes with their figures, held while the turn runs
        await pilot.pause()
        panes = [w for w in app.query(Pane) if w.size.height > 1]
        assert len(panes) >= 7

        def textuals(pane):  # Textual's render of the whole pane (Widget.render_line's cache)
            Widget._render_content(pane)
            return list(pane._render_cache.lines)

        def check():
            for pane in panes:
                mine = [pane.render_line(y) for y in range(pane.size.height)]
                assert mine == textuals(pane), pane.id

        check()
        from ds4tui.widgets import pane as P
        assert P.ROWS_ALONE  # (the pinned Textual has the parts it builds on)
        stages = app.query_one("#stages", Pane)
        rows = stages.size.height
        whole = []
        original = Widget._render_content
        Widget._render_content = lambda self: (whole.append(self.id), original(self))[1]
        try:
            # one row changes (a row of the same text wraps the same way): only that row is rendered
            text = stages.text.split("\n")
            stages.put(Content("\n".join([text[0] + " ", *text[1:]])))
            await pilot.pause()
        finally:
            Widget._render_content = original
        assert "stages" not in whole and stages.render_line(0) == textuals(stages)[0]
        # a shorter text while held (blank rows keep the height), a line that wraps, a link
        stages.put(Content("one row"))
        await pilot.pause()
        assert stages.size.height == rows
        check()
        stages.put(Content("word " * 60) + Content("\n") + Content.from_markup("[link='https://x.org']a link[/] and "
                                                                              "[@click=app.bell]an action[/]"))
        await pilot.pause()
        check()
        gate.set()
        await app.workers.wait_for_complete()
        await app.flush()


def test_row_crop_compositor_needs_textuals_parts_and_is_used_when_they_are_there():
    from textual._compositor import Compositor

    from ds4tui.widgets.screen import ROW_CROP_NEEDS, ChatScreen, RowCropCompositor, row_crop_supported

    assert row_crop_supported(Compositor)  # the pinned Textual has every part
    for missing in ROW_CROP_NEEDS:  # a Textual without one of them keeps its own compositor
        stripped = type("StrippedCompositor", (), {n: None for n in ROW_CROP_NEEDS if n != missing})
        assert not row_crop_supported(stripped), missing
    assert type(ChatScreen()._compositor) is RowCropCompositor
