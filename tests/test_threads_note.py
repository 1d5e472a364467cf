"""More engine threads than the cores this process may use run as asked; ``threads_note`` says so,
with the ``--threads`` value that uses each core once, in the engine, on ``generate``'s standard
error and in its JSON, and is "" when the threads fit."""

from __future__ import annotations

import json
import os

import pytest

from ds4tui.cli import main as cli_main
from ds4tui.engine import session as S


def test_the_note_counts_the_usable_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 5}, raising=False)  # 2 of many cores
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert S.usable_cores() == 2
    assert S.threads_note(256) == ("256 threads asked on 2 usable cores: the workers share cores, which is usually "
                                   "slower; --threads 2 uses each core once")
    assert S.threads_note(3) == ("3 threads asked on 2 usable cores: the workers share cores, which is usually "
                                 "slower; --threads 2 uses each core once")
    assert S.threads_note(2) == "" and S.threads_note(1) == ""
    monkeypatch.delattr(os, "sched_getaffinity")  # no affinity mask (macOS): every core counted
    assert S.usable_cores() == 64
    assert S.threads_note(64) == "" and S.threads_note(65).startswith("65 threads asked on 64 usable cores: ")
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: one
    assert S.usable_cores() == 1 and S.threads_note(2) == ("2 threads asked on 1 usable core: the workers share cores, "
                                                           "which is usually slower; --threads 1 uses each core once")


@pytest.mark.parametrize("threads, note", [
    ("3", "3 threads asked on 2 usable cores: the workers share cores, which is usually slower; --threads 2 uses "
          "each core once"),
    ("2", ""),
])
def test_generate_honours_the_count_and_says_it_in_the_json(threads, note, tiny_q2, capsys, monkeypatch):
    monkeypatch.setattr(S, "usable_cores", lambda: 2)
    rc = cli_main(["generate", tiny_q2["model"], "-p", "hi", "-n", "2", "--backend", "cpu", "--threads", threads,
                   "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    r = json.loads(out.out)
    assert r["n_threads"] == int(threads) and r["threads_note"] == note  # the count asked runs, only explained
    assert (f"ds4tui generate: note: {note}\n" in out.err) if note else ("threads asked" not in out.err)


@pytest.mark.parametrize("mask", [{0}, {0, 1}])
def test_threads_0_runs_one_per_core_of_the_affinity_mask(mask, tiny_q2, capsys, monkeypatch):
    """--threads 0 (the default) counts the cores this process may run on (taskset, a cpuset), not the
    machine's online cores, so that the default never draws the note about sharing cores."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(mask), raising=False)
    rc = cli_main(["generate", tiny_q2["model"], "-p", "hi", "-n", "2", "--backend", "cpu", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    r = json.loads(out.out)
    assert r["n_threads"] == len(mask) and r["threads_note"] == "" and "threads asked" not in out.err
