"""End to end: ``ds4tui chat`` in a real terminal (tmux), driven with send-keys, read with
capture-pane (ux.md §4.5).  .ci/run installs tmux; without it the test is skipped."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)")


class Tmux:
    def __init__(self, name: str):
        self.base = ["tmux", "-L", name]

    def __call__(self, *args: str) -> str:
        return subprocess.run(self.base + list(args), check=True, capture_output=True, text=True).stdout

    def screen(self) -> str:
        return self("capture-pane", "-t", "e2e", "-p")

    def wait_for(self, pattern: str, timeout: float) -> str:
        t0 = time.monotonic()
        while True:
            screen = self.screen()
            if re.search(pattern, screen):
                return screen
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"{pattern!r} did not appear within {timeout} s; the screen:\n{screen}")
            time.sleep(0.3)


def test_chat_streams_and_shows_live_panes_in_a_terminal(tiny_q2, fitted_support, tmp_path):
    tmux = Tmux(f"ds4tui-e2e-{os.getpid()}")
    cmd = (f"cd {tmp_path} && env -u COLUMNS -u LINES TERM=xterm-256color XDG_CACHE_HOME={tmp_path}/cache {sys.executable} -m ds4tui chat {tiny_q2['model']} "
           f"--mtp {fitted_support} --backend cpu --ctx 1024 -n 48 --nothink; sleep 60")
    tmux("-f", "/dev/null", "new-session", "-d", "-s", "e2e", "-x", "160", "-y", "50", cmd)
    try:
        tmux("resize-window", "-t", "e2e", "-x", "160", "-y", "50")
        tmux.wait_for(r"ready · nothink", 120)
        tmux("send-keys", "-t", "e2e", "F3")  # scheduler off: every cycle drafts
        tmux.wait_for(r"sched off", 20)
        tmux("send-keys", "-t", "e2e", "-l", "Write a linked list in Python")
        tmux("send-keys", "-t", "e2e", "Enter")
        screen = tmux.wait_for(r"stop: (max_tokens|eos)", 120)
        (tmp_path / "screen.txt").write_text(screen)
        print(screen)
        assert "Write a linked list in Python" in screen
        m = re.search(r"(\d+) tokens · (\d+) from accepted drafts \(\d+% of", screen)
        assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, screen
        cycles = re.search(r"cycles (\d+)", screen)
        assert cycles and int(cycles.group(1)) > 0, screen
        assert re.search(r"accept \d+\.\d% of proposed · ", screen)
        assert "every one of" in screen  # no-draft pane: with the scheduler off every cycle drafted
        assert re.search(r"verify +\d+\.\d{3}", screen)  # stage timings
        tmux("send-keys", "-t", "e2e", "C-q")
        t0 = time.monotonic()
        while "DSpark knobs" in tmux.screen() and time.monotonic() - t0 < 30:
            time.sleep(0.3)
        assert "DSpark knobs" not in tmux.screen()  # the app quit
    finally:
        subprocess.run(tmux.base + ["kill-server"], capture_output=True)


def _running(tag: str) -> bool:
    return subprocess.run(["pgrep", "-f", f"ds4tui chat .*--save-dir {tag}"], capture_output=True).returncode == 0


def test_closing_the_terminal_mid_answer_ends_the_process(tiny_q2, tmp_path):
    tmux = Tmux(f"ds4tui-hup-{os.getpid()}")
    cmd = (f"env -u COLUMNS -u LINES TERM=xterm-256color {sys.executable} -m ds4tui chat {tiny_q2['model']} "
           f"--backend cpu --ctx 4096 --nothink --save-dir {tmp_path}")
    tmux("-f", "/dev/null", "new-session", "-d", "-s", "e2e", "-x", "120", "-y", "40", cmd)
    try:
        tmux.wait_for(r"ready · nothink", 120)
        tmux("send-keys", "-t", "e2e", "-l", "Tell me a long story")
        tmux("send-keys", "-t", "e2e", "Enter")
        tmux.wait_for(r"generating", 30)
    finally:
        subprocess.run(tmux.base + ["kill-server"], capture_output=True)  # the terminal goes away: SIGHUP
    t0 = time.monotonic()
    while _running(str(tmp_path)) and time.monotonic() - t0 < 30:
        time.sleep(0.3)
    assert not _running(str(tmp_path)), "ds4tui chat kept running after its terminal closed"


def test_stderr_redirected_to_a_file_keeps_the_app_on_the_terminal(tiny_q2, fitted_support, tmp_path):
    """``ds4tui chat 2>log``: the app is drawn on the terminal, and the log gets what is printed
    after it — here ds4's stats line (DS4_DSPARK_STATS=1) — not the app's screen."""
    tmux = Tmux(f"ds4tui-err-{os.getpid()}")
    log = tmp_path / "err.log"
    cmd = (f"cd {tmp_path} && env -u COLUMNS -u LINES TERM=xterm-256color DS4_DSPARK_STATS=1 "
           f"XDG_CACHE_HOME={tmp_path}/cache {sys.executable} -m "
           f"ds4tui chat {tiny_q2['model']} --mtp {fitted_support} --backend cpu --ctx 1024 -n 12 --nothink "
           f"2>{log}; sleep 60")
    tmux("-f", "/dev/null", "new-session", "-d", "-s", "e2e", "-x", "160", "-y", "45", cmd)
    try:
        tmux.wait_for(r"ready · nothink", 120)
        tmux("send-keys", "-t", "e2e", "-l", "Hello")
        tmux("send-keys", "-t", "e2e", "Enter")
        tmux.wait_for(r"stop: (max_tokens|eos)", 120)
        tmux("send-keys", "-t", "e2e", "C-q")
        t0 = time.monotonic()
        while "DSpark stats" not in (log.read_text() if log.exists() else "") and time.monotonic() - t0 < 30:
            time.sleep(0.3)
        text = log.read_text()
        assert "\x1b[" not in text and "DSpark knobs" not in text, text[:300]  # no screen drawing in the log
        assert text.strip().splitlines()[-1].startswith("DSpark stats cycles=")
    finally:
        subprocess.run(tmux.base + ["kill-server"], capture_output=True)
