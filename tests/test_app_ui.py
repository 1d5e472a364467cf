"""Interaction and layout tests of the chat app on a deterministic fake engine (tests/fake_chat.py);
every number-bearing test runs the real engine in tests/test_app.py."""

from __future__ import annotations

import threading

import pytest
from fake_chat import ANSWER, REASONING, FakeChatEngine

from ds4tui import cli
from ds4tui.app import ACTIONS, ChatOptions, DS4App
from ds4tui.engine.telemetry import FakeBackend, MemorySample
from ds4tui.widgets.chat import DRAFT_STYLE, THINK_STYLE, AssistantMessage, UserMessage

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


async def test_reasoning_trace_highlight_think_toggle_and_new_chat(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=(150, 48)) as pilot:
        await _ready(pilot)
        await _turn(pilot)
        msg = app.query_one(AssistantMessage)
        assert msg.reasoning == REASONING and msg.answer == ANSWER and msg.has_class("has-reasoning")
        await pilot.press("f4")  # token trace with accepted drafts highlighted
        assert msg.has_class("trace") and app.trace
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
    assert cli.main(["chat", str(model), "--mtp", str(tmp_path / "s.gguf")]) == 2
    assert "s.gguf: no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["chat", str(model), "--backend", "gpu"])


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
