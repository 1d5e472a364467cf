"""SVG snapshot of the whole app at a fixed terminal size (pytest-textual-snapshot).

A deterministic fake engine (tests/fake_chat.py) and a fixed memory sample keep every number on
screen the same from run to run; the numbers themselves are checked against the real engine in
tests/test_app.py.  Update the baseline with ``pytest --snapshot-update tests/test_app_snapshot.py``
after a deliberate layout change."""

from __future__ import annotations

from fake_chat import FakeChatEngine

from ds4tui.app import ChatOptions, DS4App
from ds4tui.engine.telemetry import FakeBackend, MemorySample

APU = MemorySample(t_mono_s=0.0, backend="sysfs", device="amdgpu card1 (0000:c3:00.0)", vram_total_b=512 << 20,
                   vram_used_b=310 << 20, gtt_total_b=133143986176, gtt_used_b=99 << 30, busy_pct=87)


def _app(tmp_path) -> DS4App:
    return DS4App(ChatOptions(model="demo.gguf", support="demo-support.gguf", save_dir=tmp_path),
                  engine_factory=FakeChatEngine, telemetry=FakeBackend([APU]), flush_s=None, memory_s=None)


async def _after_one_answer(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.app.flush()
    prompt = pilot.app.query_one("#prompt")
    prompt.cursor_blink = False
    prompt.value = "Write a linked list in Python"
    await pilot.press("enter")
    await pilot.app.workers.wait_for_complete()
    await pilot.app.flush()
    pilot.app.clear_notifications()
    await pilot.pause()


def test_full_layout_after_one_answer(snap_compare, tmp_path):
    assert snap_compare(_app(tmp_path), run_before=_after_one_answer, terminal_size=(150, 48))


def test_layout_160x45(snap_compare, tmp_path):
    """Every pane in view without scrolling in a 160×45 terminal (the panes in two columns)."""
    assert snap_compare(_app(tmp_path), run_before=_after_one_answer, terminal_size=(160, 45))


def test_layout_200x50(snap_compare, tmp_path):
    """Every pane in view without scrolling in a 200×50 terminal, GTT included."""
    assert snap_compare(_app(tmp_path), run_before=_after_one_answer, terminal_size=(200, 50))
