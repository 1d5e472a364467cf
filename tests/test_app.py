"""Pilot tests of the chat app on the real engine (tiny q2 test model + fitted DSpark support).

Every number asserted here is compared with what the engine itself reports (``dspark_stats``,
a target-only greedy run of the same prompt), never with a constant."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from pilot_helpers import loaded as _loaded
from pilot_helpers import until as _until

from ds4tui.app import ChatOptions, DS4App
from ds4tui.commands import compare
from ds4tui.engine import session as S
from ds4tui.engine.stats import parse_line, timed_stages
from ds4tui.engine.telemetry import format_bytes
from ds4tui.engine.tokenizer import Tokenizer, render_chat
from ds4tui.widgets.chat import AssistantMessage, PromptInput
from ds4tui.widgets.dialogs import ErrorDialog
from ds4tui.widgets.histogram import Histogram

PROMPT = "Write a Python function that reverses a linked list."


def _options(model, support, tmp_path, **kw) -> ChatOptions:
    # f32 activations: the numerics of the greedy oracle these tests compare with (the app's default,
    # auto, is q8 on the cpu; tests/test_activations.py covers it)
    kw = {"backend": "cpu", "ctx": 1024, "think": False, "max_tokens": 40, "save_dir": tmp_path, "telemetry": "rss",
          "activations": "f32", **kw}
    return ChatOptions(model=str(model), support=None if support is None else str(support), **kw)


async def _ask(pilot, app, text: str = PROMPT) -> None:
    n = len(app.turns)
    prompt = app.query_one("#prompt", PromptInput)
    prompt.value = text
    prompt.focus()
    await pilot.press("enter")
    await _until(pilot, lambda: len(app.turns) > n, what="the turn to finish")
    await app.flush()


def _greedy_ids(model, messages, n: int) -> list[int]:
    """Target-only greedy continuation of a chat, computed without the app."""
    with S.Engine(str(model)) as engine:
        tok = Tokenizer.from_gguf(engine.model.reader)
        ids = render_chat(tok, messages, think=False)
        s = engine.session(1024)
        return list(s.generate(ids, max_tokens=n, stop=[tok.eos_id]))


async def test_prompt_streams_and_panes_show_the_engine_stats(tiny_q2, fitted_support, tmp_path):
    app = DS4App(_options(tiny_q2["model"], fitted_support, tmp_path))
    async with app.run_test(size=(160, 50)) as pilot:
        await _loaded(pilot, app)
        assert app.engine.info.support_status == "attached"
        await pilot.press("f3")  # scheduler off: every cycle drafts, so the histograms fill up
        assert app.engine.knobs.scheduler is False
        # type the prompt key by key (the real input path)
        app.query_one("#prompt").focus()
        await pilot.press(*"Hello")
        await pilot.press("enter")
        await _until(pilot, lambda: app.turns, what="the first turn")
        await app.flush()
        r = app.turns[-1]
        msg = app.query(AssistantMessage).last()
        assert app.query_one("#prompt").value == ""
        # the transcript holds exactly the decoded tokens, which are the target's own greedy tokens
        assert r.ids and msg.answer == r.answer and msg.finished
        assert list(r.ids) == _greedy_ids(tiny_q2["model"], [{"role": "user", "content": "Hello"}], len(r.ids))
        tok = app.engine.tokenizer
        assert r.answer == tok.decode([i for i in r.ids if i != tok.eos_id])
        assert msg.n_draft == r.n_draft > 0

        st = app.engine.session.dspark_stats()
        assert st.proposed > 0 and st.accepted_draft > 0 and not st.check_invariants()
        assert app.last_snapshot.dspark == st
        assert app.query_one("#draft-hist", Histogram).counts == st.draft_len_hist
        assert app.query_one("#accepted-hist", Histogram).counts == st.accepted_len_hist
        accept = app.query_one("#accept").text
        # each share names what it is a share of: accept_rate of the proposed drafts (session), the
        # answer's drafted share of its output tokens
        assert accept.startswith(f"accept {st.accept_rate:.1f}% of proposed · ")
        assert msg.query_one("#summary").render().plain.startswith(
            f"{len(r.ids)} tokens · {r.n_draft} from accepted drafts ({100 * r.n_draft / len(r.ids):.0f}% of output "
            f"tokens) · ")
        assert f"cycles {st.cycles} · proposed {st.proposed}\naccepted_draft {st.accepted_draft}" in accept
        assert f"full {st.full} · partial {st.partial} · miss_first {st.miss_first}" in accept
        stages = app.query_one("#stages").text
        t = st.stage_timing()
        for name, ms in t["ms_per_drafter_pass"].items():
            if ms and name != "propose":
                assert f"{name:<16}{ms:8.3f}" in stages
            elif not ms:  # a step this drafter never ran is not listed
                assert name not in stages
        assert "at 0 ms" not in stages
        # the steps listed are those the pane listed before the first cycle: every one the cpu backend times
        listed = [line.split()[0] for line in stages.splitlines() if line.startswith("prop_")]
        assert listed == list(timed_stages("cpu")) and "prop_stage0" not in listed
        assert f"ms per drafter pass ({t['drafter_passes']} passes)" in stages
        assert f"ms per drafted cycle ({t['drafted_cycles']}) · decode ({t['plain_decodes']})" in stages
        assert f"{'verify':<16}{t['verify_ms_per_drafted_cycle']:8.3f}" in stages and "prop_markov" in stages
        no_draft = app.query_one("#no-draft").text
        assert st.no_draft == 0 and f"every one of {st.cycles} cycles drafted" in no_draft
        assert "RSS" in app.query_one("#memory").text and "engine holds" in app.query_one("#memory").text
        assert f"context {app.engine.session.n_tokens}/1024 tokens" in app.query_one("#throughput").text


async def test_knobs_reach_the_engine_and_the_next_cycles(tiny_q2, fitted_support, tmp_path):
    app = DS4App(_options(tiny_q2["model"], fitted_support, tmp_path, max_tokens=12))
    async with app.run_test(size=(160, 50)) as pilot:
        await _loaded(pilot, app)
        eng = app.engine
        await pilot.press("f2")  # DSpark off
        assert eng.knobs.enabled is False
        before = eng.session.dspark_stats()
        await _ask(pilot, app)
        after = eng.session.dspark_stats()
        cycles = after.cycles - before.cycles
        assert cycles > 0 and after.proposed == before.proposed
        assert after.no_draft_reasons["disabled"] - before.no_draft_reasons["disabled"] == cycles
        assert "disabled" in app.query_one("#no-draft").text and "dominant" in app.query_one("#no-draft").text

        await pilot.click("#dspark")  # the switch turns it back on
        await pilot.pause()
        assert eng.knobs.enabled is True
        assert "DSpark is on now (F2)" in app.query_one("#no-draft").text  # not "F2 turns DSpark on" any more
        await pilot.press("f3")
        assert eng.knobs.scheduler is False
        await pilot.press("f8", "f8")
        assert eng.knobs.threshold == pytest.approx(0.10)
        await pilot.press("f7")
        assert eng.knobs.threshold == pytest.approx(0.05)
        await pilot.press("f9")
        assert eng.knobs.max_draft == eng.info.block_size - 1
        thr = app.query_one("#threshold")
        thr.focus()
        thr.value = "1"
        await pilot.press("enter")
        assert eng.knobs.threshold == 1.0  # no confidence reaches 1: nothing is drafted from now on
        before = eng.session.dspark_stats()
        await _ask(pilot, app, "And in C?")
        after = eng.session.dspark_stats()
        cycles = after.cycles - before.cycles
        assert cycles > 0 and after.proposed == before.proposed
        delta = {k: after.no_draft_reasons[k] - before.no_draft_reasons[k] for k in after.no_draft_reasons}
        # the last cycle of a 12-token answer may have a budget of one token: no room to draft
        assert delta["no_room"] <= 1 and delta["confidence_gate"] == cycles - delta["no_room"], delta
        # the engine logged each set of changes with the cycle it applied from (changes made between two
        # cycles apply together), and the series carry a mark there
        events = eng.session.dspark_events()
        assert [e.cycle for e in events] == [0, before.cycles]
        assert events[0].knobs.enabled is False and events[-1].knobs == eng.knobs
        assert app.timeline.view().marks
        thr.focus()
        thr.value = "-0"  # a zero with a sign: the knob and its toast are 0, not -0.00
        await pilot.press("enter")
        assert str(eng.knobs.threshold) == "0.0"
        await _until(pilot, lambda: any("confidence threshold 0.00" in str(n.message) for n in app._notifications),
                     what="the toast")
        assert not any("-0.00" in str(n.message) for n in app._notifications)
        bad = app.query_one("#max-draft")
        bad.focus()
        bad.value = "99"
        await pilot.press("enter")
        assert eng.knobs.max_draft == eng.info.block_size - 1  # refused by the validator, knob unchanged


async def test_escape_stops_and_keeps_the_text_then_the_chat_goes_on(tiny_q2, fitted_support, tmp_path):
    # a context with room for the next turn however late the key lands (the tiny model decodes
    # hundreds of tokens a second: on a busy machine Esc may land after most of a 1024 context)
    app = DS4App(_options(tiny_q2["model"], fitted_support, tmp_path, max_tokens=None, ctx=4096))
    async with app.run_test(size=(160, 50)) as pilot:
        await _loaded(pilot, app)
        prompt = app.query_one("#prompt", PromptInput)
        prompt.value = PROMPT
        await pilot.press("enter")
        await _until(pilot, lambda: app.current is not None and app.current.n_tokens >= 8, what="streamed tokens")
        await pilot.press("escape")
        await _until(pilot, lambda: app.turns, what="the stopped turn")
        await app.flush()
        r = app.turns[-1]
        msg = app.query(AssistantMessage).first()
        assert r.reason == "stopped" and 8 <= len(r.ids) < 4096 - r.prompt_tokens
        assert msg.answer == r.answer and r.answer and "stop: stopped" in str(msg.query_one("#summary").render())
        assert app.messages[-1] == {"role": "assistant", "content": r.answer, "reasoning": ""}
        # the next turn reuses the KV cache of the conversation and runs normally
        app.options.max_tokens = 6
        await _ask(pilot, app, "Shorter, please.")
        r2 = app.turns[-1]
        assert r2.reason in ("max_tokens", "eos") and len(app.query(AssistantMessage)) == 2
        # the cache is reused when the stopped answer is within one batch of the shared prefix (the
        # rings can be truncated that far back); a slow runner may let more tokens through before Esc
        if len(r.ids) < app.engine.session.n_batch // 2:
            assert r2.reused_tokens > 0
        # prompt history: up recalls the previous prompts
        prompt.focus()
        await pilot.press("up")
        assert prompt.value == "Shorter, please."
        await pilot.press("up")
        assert prompt.value == PROMPT


async def test_save_transcript_and_export_stats(tiny_q2, fitted_support, tmp_path):
    app = DS4App(_options(tiny_q2["model"], fitted_support, tmp_path, max_tokens=16))
    async with app.run_test(size=(160, 50)) as pilot:
        await _loaded(pilot, app)
        await _ask(pilot, app)
        r = app.turns[-1]
        await pilot.press("ctrl+s")
        await pilot.press("f6")
        await pilot.pause()
        md = next(tmp_path.glob("ds4tui-chat-*.md")).read_text()
        assert PROMPT in md and r.answer.strip()[:20] in md
        saved = json.loads(next(tmp_path.glob("ds4tui-chat-*.json")).read_text())
        assert saved["messages"][0] == {"role": "user", "content": PROMPT}
        assert saved["messages"][1]["stats"]["ids"] == list(r.ids)
        assert saved["messages"][1]["stats"]["n_draft"] == r.n_draft
        st = app.engine.session.dspark_stats()
        stats = json.loads(next(tmp_path.glob("ds4tui-stats-*.json")).read_text())
        assert stats["dspark_stats"]["draft_len_hist"] == list(st.draft_len_hist)
        assert stats["dspark_stats"]["accepted_draft"] == st.accepted_draft
        # where the scheduler started, under generate --json's names (compare's scheduler_start)
        assert (stats["scheduler_prices"], stats["scheduler_prices_at_start"], stats["scheduler_prices_retime"]) == (
            app.engine.engine.scheduler_prices, app.engine.session.scheduler_prices_at_start, None)  # generate's null
        assert saved["session"]["scheduler_prices_at_start"] == stats["scheduler_prices_at_start"]
        # compare reads both as written: every knob of the type and in the range it checks
        assert [compare.load(str(next(tmp_path.glob(f"ds4tui-{name}-*.json"))))[0] for name in ("stats", "chat")] == [
            "stats-export", "transcript"]
        line = next(tmp_path.glob("ds4tui-stats-*.txt")).read_text().strip()
        assert line.startswith("DSpark stats cycles=")
        back = parse_line(line)
        assert (back["cycles"], back["proposed"], back["accepted_draft"]) == (st.cycles, st.proposed, st.accepted_draft)


async def test_bad_model_file_shows_an_error_dialog_and_the_app_stays_usable(tmp_path):
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 8)
    app = DS4App(_options(bad, None, tmp_path))
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: app.errors, what="the load error")
        await pilot.pause()
        assert isinstance(app.screen, ErrorDialog)
        title, message = app.errors[0]
        assert title == "cannot open the model" and str(bad) in message
        await pilot.press("enter")
        assert not isinstance(app.screen, ErrorDialog)
        assert app.engine is None and app.query_one("#prompt").disabled
        assert "No model loaded" in str(app.query_one("#welcome").render()) and app.sub_title == "no model loaded"
        await pilot.press("f2")  # knobs without an engine do nothing, and nothing breaks
        assert app.is_running
        await pilot.press("ctrl+q")
    assert app.return_code == 1  # quitting after a failed load is a failure


async def test_missing_model_and_refused_support(tiny_q2, small_f32, tmp_path):
    app = DS4App(_options(tmp_path / "nope.gguf", None, tmp_path))
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: app.errors, what="the load error")
        assert "nope.gguf" in app.errors[0][1]
    # a support file made for another model (6 experts instead of 16) is refused: target-only decoding
    app = DS4App(_options(tiny_q2["model"], small_f32["support"], tmp_path, max_tokens=4))
    async with app.run_test(size=(160, 50)) as pilot:
        await _until(pilot, lambda: app.engine is not None, what="the model")
        await _until(pilot, lambda: app.errors, what="the refusal dialog")
        title, message = app.errors[0]
        assert "refused" in title and "expert" in message
        await pilot.press("escape")
        assert "refused" in app.query_one("#support").text
        assert app.engine.knobs is None
        await pilot.press("f2")  # the knob cannot change; the app says why
        await _ask(pilot, app)
        st = app.engine.session.dspark_stats()
        assert st.cycles > 0 and st.no_draft_reasons["support_invalid"] == st.cycles
        # the panes count the refused model's cycles like the engine does
        assert app.query_one("#draft-hist", Histogram).counts == st.draft_len_hist and st.draft_len_hist[0] == st.cycles
        assert f"support_invalid{st.cycles:>{23 - len('support_invalid')}}" in app.query_one("#no-draft").text
        assert "support model refused" in app.query_one("#accept").text


async def test_context_overflow_is_a_dialog_and_the_chat_goes_on(tiny_q2, tmp_path):
    app = DS4App(_options(tiny_q2["model"], None, tmp_path, ctx=48, max_tokens=4))
    async with app.run_test(size=(160, 50)) as pilot:
        await _loaded(pilot, app)
        prompt = app.query_one("#prompt", PromptInput)
        prompt.value = "word " * 80
        await pilot.press("enter")
        await _until(pilot, lambda: app.errors, what="the overflow dialog")
        await app.flush()
        title, message = app.errors[-1]
        assert "does not fit a context of 48" in message and isinstance(app.screen, ErrorDialog)
        await pilot.press("escape")
        assert app.messages == [] and not app._generating  # the prompt left the conversation
        await _ask(pilot, app, "Hi")
        assert app.turns[-1].ids and [m["role"] for m in app.messages] == ["user", "assistant"]


async def test_quit_while_an_answer_streams(tiny_q2, tmp_path):
    app = DS4App(_options(tiny_q2["model"], None, tmp_path, max_tokens=None))
    async with app.run_test(size=(160, 50)) as pilot:
        await _loaded(pilot, app)
        prompt = app.query_one("#prompt", PromptInput)
        prompt.value = PROMPT
        prompt.focus()  # as _ask does: enter submits only from the prompt, wherever the focus was after loading
        await pilot.press("enter")
        try:
            await _until(pilot, lambda: app.current is not None and app.current.n_tokens >= 4, what="streamed tokens")
        except AssertionError as exc:  # say where the turn stood (this wait has timed out once on a loaded machine)
            raise AssertionError(f"{exc}: turns {len(app.turns)}, generating {app._generating}, current "
                                 f"{None if app.current is None else app.current.n_tokens} tokens, engine "
                                 f"generating {app.engine.generating}, errors {app.errors}") from None
        engine = app.engine
        await pilot.press("ctrl+q")
        await _until(pilot, lambda: not app.is_running, timeout=30, what="the app to exit")
    assert app.return_code == 0 and not engine.generating
    app.close_engine()


async def test_the_context_size_changes_from_the_palette_with_the_memory_it_needs(tiny_q2, tmp_path):
    from ds4tui.widgets.dialogs import AskPath

    app = DS4App(_options(tiny_q2["model"], None, tmp_path, max_tokens=4))
    async with app.run_test(size=(160, 45)) as pilot:
        await _loaded(pilot, app)
        await _ask(pilot, app, "Hi")
        await pilot.press("ctrl+g")
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, AskPath) and dialog.query_one("#ask-path").value == "1024"
        dialog.query_one("#ask-path").value = "3000"
        await pilot.pause()
        plan = app.engine.session_plan(3000)
        about = str(dialog.query_one("#ask-about").render())
        assert about.startswith("a session of 3000 tokens holds ")
        assert f"compressed KV {format_bytes(plan['compressor'])}" in about  # inspect's name for the row
        await pilot.press("enter")
        await _until(pilot, lambda: app.engine.session.n_ctx == 3000, what="the new session")
        await pilot.pause()
        assert app.messages == [] and app.engine.info.n_ctx == 3000
        mem = app.engine.session.memory()  # what the dialog promised is what the session holds
        assert about == (f"a session of 3000 tokens holds {format_bytes(mem.kv + mem.compressor + mem.scratch)} beside "
                         f"the weights: KV window ring {format_bytes(mem.kv)}, compressed KV "
                         f"{format_bytes(mem.compressor)}, scratch {format_bytes(mem.scratch)}")
        mem = app.engine.session.memory()
        assert (mem.kv, mem.compressor) == (plan["kv"], plan["compressor"])
        assert "context 0/3000 tokens" in app.query_one("#throughput").text
        await _ask(pilot, app, "Hi")  # and the chat goes on in the new session
        assert app.turns[-1].ids
        # a size that is no number: the dialog said "invalid literal for int() with base 10: 'abc'"
        await pilot.press("ctrl+g")
        await pilot.pause()
        app.screen.query_one("#ask-path").value = "abc"
        await pilot.press("enter")
        await _until(pilot, lambda: app.errors, what="the error dialog")
        assert app.errors == [("cannot change the context size", "context size: expected a whole number of tokens, "
                               f"2..{app.engine.engine.config.context_length}, found 'abc'; the session keeps its size")]
        assert isinstance(app.screen, ErrorDialog) and app.engine.info.n_ctx == 3000


async def test_an_answer_that_fills_the_context_says_what_to_do_once(tiny_q2, tmp_path):
    """Unlimited answers in a small context: the turn stops with ``ctx`` (the engine's reason) and
    its summary and one toast say the context is full, with the keys that help; a turn that stops
    for another reason says nothing of it."""
    from ds4tui.app import context_full_hint

    hint = "the context is full: Ctrl+N starts a new chat, Ctrl+G a larger context"
    assert context_full_hint() == hint
    app = DS4App(_options(tiny_q2["model"], None, tmp_path, ctx=48, max_tokens=None))
    async with app.run_test(size=(200, 50)) as pilot:
        await _loaded(pilot, app)
        await _ask(pilot, app, "Hi")
        await pilot.pause()
        r = app.turns[-1]
        assert r.reason == "ctx" and len(r.ids) > 8  # the engine stopped: every position of 48 holds a token
        summary = app.query(AssistantMessage).last()._summary._line[0]
        assert summary.endswith(f"stop: ctx · {hint}")
        toasts = [m.message for m in app._notifications]
        assert toasts.count(hint) == 1
        await pilot.press("ctrl+n")
        app.options.max_tokens = 4
        await _ask(pilot, app, "Hi")
        await pilot.pause()
        assert app.turns[-1].reason == "max_tokens"
        assert hint not in app.query(AssistantMessage).last()._summary._line[0]
        assert [m.message for m in app._notifications].count(hint) <= 1  # toasts time out; never a second one


async def test_an_answer_shows_why_its_session_re_timed_the_kept_scheduler_prices(tiny_q2, tmp_path, monkeypatch):
    """The note at open says which kept scheduler prices a session leaves for its drafting to re-time
    (spec dspark.md §7.4); a later session (Ctrl+G) decides that again, and the answer whose drafting
    re-times them says why in its summary, with the engine's own words (``Session.scheduler_prices_retime``).
    Here the saved verify and proposal times were measured while other work kept 2.0 cores busy: the same
    load at open (nothing re-timed, the welcome line says none), 0.1 cores at the new session."""
    from ds4tui.engine import prices as P

    prices_dir = tmp_path / "prices"
    stamp = time.time() - 600  # within the hour: only the load can make them stale
    # drafting cannot pay with these (a verify and a proposal of a second), so the session at open,
    # which keeps them, does not draft under the acceptance policy (tests/test_scheduler_prices.py; the
    # confidence policy proposes whatever a kept proposal cost, and its first proposal re-times it)
    kept = P.SchedulerPrices(t_ver={1: 1.0, 6: 1000.0}, t_prop=1000.0, reached=(32,) + (0,) * 15, hit=(0,) * 16,
                             verify_timed_at={6: stamp}, proposal_timed_at=stamp, verify_other_work={6: 2.0},
                             proposal_other_work=2.0)
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"], scheduler_prices="saved", prices_dir=prices_dir)
    P.save(e.scheduler_prices_file, P.identity(e), kept)
    e.close()
    load = {"cores": 2.0}
    monkeypatch.setattr(P, "other_work", lambda a, b: load["cores"])
    app = DS4App(_options(tiny_q2["model"], tiny_q2["support"], tmp_path, scheduler_prices="saved",
                          prices_dir=prices_dir, policy="acceptance"))
    async with app.run_test(size=(200, 50)) as pilot:
        await _loaded(pilot, app)
        assert app.engine.info.scheduler_prices_note.startswith("saved: from ")
        assert "re-times" not in app.engine.info.scheduler_prices_note
        assert app.engine.session.scheduler_prices_retime == ""
        await _ask(pilot, app, "Hi")
        assert app.turns[-1].scheduler_prices_retime == ""
        assert "scheduler prices:" not in app.query(AssistantMessage).last()._summary._line[0]

        load["cores"] = 0.1  # the other work stopped: the next session leaves the kept times out
        await app.set_context("512")
        retime = app.engine.session.scheduler_prices_retime
        assert retime == ("the kept times of verify(6) and the proposal were measured while other work kept 2.0 "
                          "cores busy, and it keeps 0.1 busy now (a change of 1 or more): drafting re-times them")
        await _ask(pilot, app, "Hi")
        r = app.turns[-1]
        assert r.dspark_delta["proposed"] > 0  # the drafting that re-times them
        assert r.scheduler_prices_retime == retime
        line = app.query(AssistantMessage).last()._summary._line[0]
        # why they were left out, then what the drafting measured in their place, in one clause
        assert f" · scheduler prices: {retime}; drafting re-timed the kept verify(6) " in line, line
        assert line.endswith(" ms") and line.count("scheduler prices:") == 1

        await _ask(pilot, app, "Hi again")  # the same session: nothing left to re-time
        assert app.turns[-1].scheduler_prices_retime == ""
        assert "scheduler prices:" not in app.query(AssistantMessage).last()._summary._line[0]


async def test_an_answer_lists_the_kept_scheduler_times_its_drafting_timed_again(tiny_q2, tmp_path, monkeypatch):
    """In-session (spec dspark.md §7.4): kept verify and proposal times far too cheap make the first
    answer draft at once, and its first real samples move them; that answer's summary lists each kept
    time with its new one (``Session.scheduler_prices_retimed``), a later answer of the session none."""
    from ds4tui.engine import prices as P

    prices_dir = tmp_path / "prices"
    stamp = time.time() - 60
    kept = P.SchedulerPrices(t_ver={1: 1.0, 6: 1e-6}, t_prop=1e-6, reached=(32,) * 5 + (0,) * 11,
                             hit=(32,) * 5 + (0,) * 11, verify_timed_at={6: stamp}, proposal_timed_at=stamp,
                             verify_other_work={6: 0.0}, proposal_other_work=0.0)
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"], scheduler_prices="saved", prices_dir=prices_dir)
    P.save(e.scheduler_prices_file, P.identity(e), kept)
    e.close()
    monkeypatch.setattr(P, "other_work", lambda a, b: 0.0)
    app = DS4App(_options(tiny_q2["model"], tiny_q2["support"], tmp_path, scheduler_prices="saved",
                          prices_dir=prices_dir))
    async with app.run_test(size=(200, 50)) as pilot:
        await _loaded(pilot, app)
        assert app.engine.session.scheduler_prices_retime == ""  # nothing left out at the start
        await _ask(pilot, app, "Hi")
        r = app.turns[-1]
        assert r.dspark_delta["proposed"] > 0
        now = app.engine.session.scheduler_prices()
        assert r.scheduler_prices_retimed[0] == {"time": "verify(6)", "kept_ms": 1e-6, "now_ms": now.t_ver[6]}
        assert r.scheduler_prices_retimed[-1]["time"] == "proposal" and r.scheduler_prices_retimed[-1]["kept_ms"] == 1e-6
        line = app.query(AssistantMessage).last()._summary._line[0]
        assert line.endswith(" · scheduler prices: " + P.retimed_words(list(r.scheduler_prices_retimed)))
        assert "drafting re-timed the kept verify(6) 0.00 → " in line

        await _ask(pilot, app, "Hi again")  # the same session: said once
        assert app.turns[-1].scheduler_prices_retimed == ()
        assert "re-timed the kept" not in app.query(AssistantMessage).last()._summary._line[0]
