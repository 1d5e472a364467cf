"""The verify_head option (spec dspark.md §3.4) from the command line to the engine: the flag of
chat, generate and bench, its usage errors (a bad value, lazy on a backend that does not run it),
the JSON's ``verify_head``, ``verify_head_note`` and ``verify_head_rows``, and ``ds4tui doctor``.
Exactness of lazy against all is tested in tests/test_dspark_engine.py (tiny model, fitted drafter)
and tests/test_demo.py (the demo pair)."""

from __future__ import annotations

import json

import pytest

from ds4tui import cli
from ds4tui.cli import main as cli_main
from ds4tui.engine import session as S
from test_cli_usage import _run, no_engine  # noqa: F401 (the fixture)


@pytest.mark.parametrize("command", ["generate", "bench", "chat"])
def test_bad_values_are_usage_errors_naming_the_flag(command, tiny_q2, capsys, no_engine):
    base = {"generate": ["generate", str(tiny_q2["model"]), "-p", "hi"], "bench": ["bench", str(tiny_q2["model"]),
            "--ab", "--mtp", str(tiny_q2["support"])], "chat": ["chat", str(tiny_q2["model"])]}[command]
    rc, out, err = _run(capsys, [*base, "--verify-head", "some"])
    assert rc == 2 and out == ""
    assert "error: argument --verify-head: invalid choice: 'some' (choose from 'auto', 'lazy', 'all')" in err
    rc, out, err = _run(capsys, [*base, "--verify-head", "lazy", "--backend", "hip"])
    assert rc == 2 and out == ""
    assert err == (f"ds4tui {command}: error: argument --verify-head: lazy runs on the cpu backend only (its verify "
                   f"computes every row's LM head in one pass on the device), found --backend hip (use --verify-head "
                   f"auto or all, or --backend cpu or auto)\n")
    if command == "generate":  # under --json the usage error is also the JSON line
        rc, out, err = _run(capsys, [*base, "--verify-head", "lazy", "--backend", "reference", "--json"])
        assert rc == 2 and json.loads(out) == {"ok": False, "error": (
            "argument --verify-head: lazy runs on the cpu backend only (it does not draft), found --backend reference "
            "(use --verify-head auto or all, or --backend cpu or auto)")}


def test_bench_takes_it_with_ab_only(tiny_q2, capsys, no_engine):
    rc, out, err = _run(capsys, ["bench", str(tiny_q2["model"]), "--verify-head", "all"])
    assert rc == 2 and "--verify-head is an option of the A/B run: add --ab" in err


def _gen(capsys, model, support, *extra) -> dict:
    rc, out, err = _run(capsys, ["generate", str(model), "--mtp", str(support), "-p", "hello there", "--raw", "-n", "24",
                                 "--no-scheduler", "--threads", "1", "--backend", "cpu", "--json", *extra])
    assert rc == 0, err
    return json.loads(out)


def test_generate_json_names_the_mode_and_counts_the_rows(tiny_q2, fitted_support, capsys):
    full = _gen(capsys, tiny_q2["model"], fitted_support)  # the default: auto, all on the cpu with q8 activations
    assert full["activations"] == "q8" and full["verify_head"] == "all"
    assert full["verify_head_note"].startswith("auto: all on the cpu backend with q8 activations")
    lazy = _gen(capsys, tiny_q2["model"], fitted_support, "--verify-head", "lazy")
    assert (lazy["verify_head"], lazy["verify_head_note"]) == ("lazy", "lazy: chosen")
    f32 = _gen(capsys, tiny_q2["model"], fitted_support, "--activations", "f32")
    assert f32["verify_head"] == "lazy" and f32["verify_head_note"].startswith("auto: lazy on the cpu backend with f32")
    assert lazy["generated_ids"] == full["generated_ids"]
    a, b = full["dspark_stats"], lazy["dspark_stats"]
    drafted = a["full"] + a["partial"] + a["miss_first"]
    assert drafted > 0 and b["invariant_violations"] == [] and a["invariant_violations"] == []
    assert a["verify_head_rows"] == a["proposed"] + drafted  # all: every row of every verify
    assert a["stage_timing"]["verify_head_rows_per_drafted_cycle"] == a["stage_timing"]["verify_rows_per_drafted_cycle"]
    # lazy: 3 rows per verify at least (the block is 5), more only where the first 3 drafts were accepted
    assert 3 * drafted <= b["verify_head_rows"] < a["verify_head_rows"]
    assert {k: a[k] for k in ("proposed", "accepted_draft", "full", "partial", "miss_first")} == \
        {k: b[k] for k in ("proposed", "accepted_draft", "full", "partial", "miss_first")}


def test_generate_notes_it_is_moot_without_drafting(tiny_q2, capsys):
    rc, out, err = _run(capsys, ["generate", str(tiny_q2["model"]), "--mtp", str(tiny_q2["support"]), "-p", "hi",
                                 "--raw", "-n", "2", "--no-dspark", "--verify-head", "all", "--backend", "cpu"])
    assert rc == 0
    assert ("--verify-head has no effect because --no-dspark turns drafting off (every cycle decodes target-only; "
            "leave out --no-dspark to draft)") in err


def test_generate_notes_it_is_moot_without_a_support_model(tiny_q2, capsys):
    """No --mtp (or the demo on the reference backend, which attaches none): --verify-head is noted
    as having no effect, as --draft-vocab is."""
    rc, out, err = _run(capsys, ["generate", str(tiny_q2["model"]), "-p", "hi", "--raw", "-n", "1", "--verify-head",
                                 "all", "--draft-vocab", "full", "--backend", "cpu"])
    assert rc == 0
    assert ("ds4tui generate: note: --draft-vocab full has no effect: no DSpark support model drafts (give one with "
            "--mtp)\nds4tui generate: note: --verify-head all has no effect: no DSpark support model drafts (give one "
            "with --mtp)\n") in err, err
    assert "--scheduler-prices" not in err  # not given: nothing to say
    rc, out, err = _run(capsys, ["generate", str(tiny_q2["model"]), "-p", "hi", "--raw", "-n", "1",
                                 "--scheduler-prices", "fresh", "--backend", "cpu"])
    assert rc == 0 and ("ds4tui generate: note: --scheduler-prices fresh has no effect: no DSpark support model "
                        "drafts (give one with --mtp)\n") in err, err


def test_the_moot_notes_on_the_reference_backend_say_it_does_not_draft():
    """generate without MODEL on the reference backend leaves the demo's drafter out (and --mtp is a
    usage error there): the notes say why, not to give one with --mtp."""
    from types import SimpleNamespace

    from ds4tui.commands.environment import Settings, draft_vocab_notes, verify_head_notes

    engine = SimpleNamespace(backend="reference", support_status="none")
    settings = Settings(verify_head="lazy", draft_vocab="full")
    assert verify_head_notes(settings, engine) + draft_vocab_notes(settings, engine) == [
        "--verify-head lazy has no effect: no DSpark support model drafts (the reference backend does not draft)",
        "--draft-vocab full has no effect: no DSpark support model drafts (the reference backend does not draft)"]
    assert verify_head_notes(settings, SimpleNamespace(backend="cpu", support_status="attached")) == []
    assert verify_head_notes(Settings(), engine) == []  # auto: nothing was asked


def test_lazy_on_a_backend_auto_moved_to_the_gpu_runs_all_and_says_so(tiny_q2):
    """--backend auto may open the GPU: a lazy asked for is then not refused, it runs all, and the
    note says why (the command line prints it, environment.gpu_options_not_applied)."""
    from ds4tui.commands.environment import Settings, gpu_options_not_applied

    class OnGpu:
        verify_head, verify_head_note = "all", "all: lazy runs on the cpu backend only, and ..."
        prefill_gemm, gpu_graphs = "off", "off"

    assert gpu_options_not_applied(Settings(verify_head="lazy"), OnGpu()) == [
        "--verify-head lazy does not apply, the verify head is all: lazy runs on the cpu backend only, and ..."]
    assert gpu_options_not_applied(Settings(verify_head="auto"), OnGpu()) == []


def test_doctor_lists_the_option(capsys):
    assert cli_main(["doctor", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    d = r["verify_head"]
    assert d["default"] == "auto" and d["choices"] == ["auto", "lazy", "all"]
    assert d["here"] == "all"  # auto's backend runs q8 activations on the cpu, and the hip backend verifies every row
    assert cli_main(["doctor"]) == 0
    line = next(t for t in capsys.readouterr().out.splitlines() if t.startswith("verify head"))
    assert f"auto by default (here {d['here']}, on the " in line and "lazy (rows 0-2" in line


def test_chat_passes_it_to_the_engine(tiny_q2):
    from ds4tui.commands.chat import options_from_args
    from ds4tui.engine import worker as W

    import dataclasses

    from ds4tui.commands.environment import Settings

    args = cli.build_parser().parse_args(["chat", str(tiny_q2["model"]), "--verify-head", "lazy"])
    args.settings = dataclasses.replace(Settings(), verify_head="lazy")  # as cli.main sets it from the flag
    assert options_from_args(args).verify_head == "lazy"
    chat = W.ChatEngine(tiny_q2["model"], support=tiny_q2["support"], backend="cpu", n_ctx=64, verify_head="lazy")
    try:
        assert (chat.info.verify_head, chat.info.verify_head_note) == ("lazy", "lazy: chosen")
    finally:
        chat.close()
    chat = W.ChatEngine(tiny_q2["model"], support=tiny_q2["support"], backend="cpu", n_ctx=64)  # q8 by auto
    try:
        assert chat.info.verify_head == "all" and chat.info.verify_head_note.startswith("auto: all on the cpu backend")
    finally:
        chat.close()
